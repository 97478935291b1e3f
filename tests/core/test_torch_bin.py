"""PyTorch .bin checkpoints: loaded without executing code; anything but tensors is refused."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from llmrs_core.formats.torch_bin import UnsafeCheckpointError, load_torch_bin

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def test_reads_a_real_torch_checkpoint():
    """tests/golden/torch_checkpoint.bin was written by torch.save (scripts/capture_golden.py torchbin)."""
    state = load_torch_bin(GOLDEN / "torch_checkpoint.bin")
    want = np.load(GOLDEN / "torch_checkpoint.npz")
    assert sorted(state) == sorted(k.replace("__", ".") for k in want.files)
    for name, value in state.items():
        expected = want[name.replace(".", "__")]
        assert value.shape == expected.shape and value.dtype == expected.dtype, name
        np.testing.assert_array_equal(value, expected, err_msg=name)


class _Payload:
    """Unpickling this would call os.system — the classic pickle attack."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def zip_checkpoint(tmp_path, payload: bytes, extra: dict | None = None) -> Path:
    path = tmp_path / "evil.bin"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return path


def test_code_in_the_pickle_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = zip_checkpoint(tmp_path, pickle.dumps({"weight": _Payload(marker)}, protocol=2))
    with pytest.raises(UnsafeCheckpointError, match=r"posix\.system|os\.system"):
        load_torch_bin(path)
    assert not marker.exists(), "the payload ran!"


@pytest.mark.parametrize("target", [("builtins", "eval"), ("subprocess", "Popen"), ("torch", "load")])
def test_any_other_global_is_refused(tmp_path, target):
    module, name = target
    payload = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X\x04\x00\x00\x00argsq\x00\x85q\x01Rq\x02."
    with pytest.raises(UnsafeCheckpointError, match=f"{module}.{name}"):
        load_torch_bin(zip_checkpoint(tmp_path, payload))


def test_not_a_zip(tmp_path):
    path = tmp_path / "legacy.bin"
    path.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(ValueError, match="not a zip-format"):
        load_torch_bin(path)


def test_missing_storage_and_bad_views(tmp_path):
    good = (GOLDEN / "torch_checkpoint.bin").read_bytes()
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        names = z.namelist()
        pkl = next(n for n in names if n.endswith("data.pkl"))
        entries = {n: z.read(n) for n in names}
    storage = next(n for n in names if "/data/" in n)
    del entries[storage]
    path = tmp_path / "broken.bin"
    with zipfile.ZipFile(path, "w") as z:
        for n, data in entries.items():
            z.writestr(n, data)
    with pytest.raises(pickle.UnpicklingError, match="missing from the archive"):
        load_torch_bin(path)
    assert pkl.endswith("data.pkl")


def test_a_pickle_that_is_not_a_state_dict(tmp_path):
    with pytest.raises(ValueError, match="not a state dict"):
        load_torch_bin(zip_checkpoint(tmp_path, pickle.dumps([1, 2, 3], protocol=2)))
