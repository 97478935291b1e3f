"""Make real quantisation mixes with llama.cpp, and what ggml computes on them (issue 28).

A Q4_K_M file is not only Q4_K: llama.cpp's ``llama_model_quantize`` gives some
tensors Q6_K, others Q5_K, and so on. This script makes such files from one
tiny F32 Llama, with llama.cpp's own quantiser, and records the references the
tests compare the engine with. CI needs neither llama.cpp nor this script. Run
it in the reference environment (llama-cpp-python, gguf), from the repository
root::

    /opt/ref-venv/bin/python scripts/make_quant_mixes.py \
        --gguf-py <llama-cpp-python 0.3.36 sdist>/vendor/llama.cpp/gguf-py

(``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`` fetches the sdist.)

Writes into tests/golden/quant_mixes/:

    <MIX>.gguf      llama_model_quantize(<the F32 model>, ftype MIX), no importance matrix
    golden.npz      ids [T]; <MIX>_logits [T, V]: llama.cpp's logits on each file and on
                    the F32 model (F32 KV cache, no flash attention, every position)
    golden.json     per mix: the ftype, each tensor's type, and sha256 of gguf-py's
                    dequantisation of it (the vendored gguf-py's quants.py: a reference
                    no one here wrote); the F32 model's sha256 (the tests rebuild it with
                    tests/core/quant_cases.py's write_mix_source);
                    ggml_digests: sha256[:24] of ggml's own quantisers
                    (quantize_row_*_ref, quantize_iq4_nl/xs, the BF16 row conversion, called
                    in libggml-base through ctypes) on tests/core/quant_cases.py's inputs

The F32 model is not stored (7 MB): it is rebuilt from its seed, and its
sha256 checked, by the tests.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "golden" / "quant_mixes"
sys.path.insert(0, str(REPO))

#: mix name -> llama.cpp's ftype (llama_cpp.LLAMA_FTYPE_MOSTLY_*)
MIXES = ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "IQ4_NL", "Q5_0", "Q5_1")

#: the types whose quantiser the digests cover, with the ggml function that quantises them
DIGEST_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS", "BF16")

N_TOKENS = 48


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_cases():
    """tests/core/quant_cases.py (the tests' inputs and the F32 model), loaded by path."""
    spec = importlib.util.spec_from_file_location("quant_cases", REPO / "tests" / "core" / "quant_cases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ggml_library() -> ctypes.CDLL:
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(lib_dir.glob("libggml-base.so*"))
    if not candidates:
        raise SystemExit(f"no libggml-base.so in {lib_dir}")
    return ctypes.CDLL(str(candidates[0]))


def ggml_quantize(lib: ctypes.CDLL, type_name: str, x: np.ndarray) -> bytes:
    """ggml's quantiser of ``type_name`` on float32 rows ``x`` [rows, n] (what llama_model_quantize
    runs without an importance matrix)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    out = np.zeros(rows * n // block * size, np.uint8)
    p = ctypes.c_void_p
    if type_name in ("IQ4_NL", "IQ4_XS"):
        fn = getattr(lib, f"quantize_{type_name.lower()}")
        fn.argtypes = [p, p, ctypes.c_int64, ctypes.c_int64, p]
        fn(x.ctypes.data, out.ctypes.data, rows, n, None)
    elif type_name == "BF16":
        fn = lib.ggml_fp32_to_bf16_row_ref
        fn.argtypes = [p, p, ctypes.c_int64]
        fn(x.ctypes.data, out.ctypes.data, x.size)
    else:
        fn = getattr(lib, f"quantize_row_{type_name.lower().replace('_k', '_K')}_ref")
        fn.argtypes = [p, p, ctypes.c_int64]
        fn(x.ctypes.data, out.ctypes.data, x.size)
    return out.tobytes()


def llama_logits(path: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits at every position, float32 [T, V]."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=128, n_threads=2, n_batch=64, logits_all=True, verbose=False,
                seed=0, type_k=0, type_v=0, flash_attn=False)
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf-py", type=Path, default=None,
                        help="the sdist's vendor/llama.cpp/gguf-py, put first on sys.path (its quants.py "
                             "is the dequantisation reference); default: the installed gguf")
    args = parser.parse_args()
    if args.gguf_py is not None:
        sys.path.insert(0, str(args.gguf_py))
    import gguf
    import llama_cpp
    from gguf import GGUFReader
    from gguf.quants import dequantize

    OUT.mkdir(parents=True, exist_ok=True)
    cases = load_cases()
    summary: dict = {"llama_cpp_python": llama_cpp.__version__, "mixes": {}}
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "f32.gguf"
        cases.write_mix_source(f32)
        summary["model"] = cases.MIX_MODEL | {"seed": cases.MIX_SEED}
        summary["f32_sha256"] = sha256(f32.read_bytes())
        ids = np.random.default_rng(0).integers(0, cases.MIX_MODEL["vocab_size"] - 1, N_TOKENS).tolist()
        arrays["ids"] = np.array(ids, np.int64)
        arrays["F32_logits"] = llama_logits(f32, ids)
        for mix in MIXES:
            path = OUT / f"{mix}.gguf"
            qp = llama_cpp.llama_model_quantize_default_params()
            qp.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix}")
            qp.nthread = 2
            rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(path).encode(), ctypes.byref(qp))
            if rc != 0:
                raise SystemExit(f"llama_model_quantize {mix}: returned {rc}")
            reader = GGUFReader(path)
            tensors = {}
            for t in reader.tensors:
                values = dequantize(t.data, t.tensor_type).astype(np.float32)
                tensors[t.name] = {"type": t.tensor_type.name,
                                   "gguf_dequantized_sha256": sha256(np.ascontiguousarray(values).tobytes())}
            arrays[f"{mix}_logits"] = llama_logits(path, ids)
            summary["mixes"][mix] = {"ftype": int(qp.ftype), "bytes": path.stat().st_size, "tensors": tensors}
            types = sorted({v["type"] for v in tensors.values()})
            print(f"{mix}: {path.stat().st_size} bytes, types {types}")

    lib = ggml_library()
    summary["ggml_digests"] = {
        case: {t: sha256(ggml_quantize(lib, t, cases.make_case(case)))[:24] for t in DIGEST_TYPES}
        for case in cases.CASE_NAMES
    }
    where = str(Path(gguf.__file__).parent)
    summary["gguf_py"] = where[where.index("vendor/"):] if "vendor/" in where else f"gguf {gguf.__version__}"
    np.savez_compressed(OUT / "golden.npz", **arrays)
    (OUT / "golden.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
