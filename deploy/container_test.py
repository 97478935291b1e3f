"""``make container-test``: run the image's own entrypoint and check it from the host (chapter 12).

``python deploy/container_test.py [IMAGE]`` (default ``localhost/llmrs:latest``, built by
``make container``):

1. ``buildah from`` the image, then ``buildah run --isolation chroot`` its ENTRYPOINT + CMD,
   as the image's USER, with ``--host 127.0.0.1 --port P`` appended (a free port: chroot
   isolation shares the host's network, so the server is reachable on 127.0.0.1);
2. from the host: ``GET /ready`` turns 200 (within ``--start-timeout`` seconds) and the
   liveness probe ``GET /health`` (the image's HEALTHCHECK) is 200,
   one chat completion through the ``openai`` client answers with text and usage, and
   the process listening on P runs as the image's non-root user (its uid in ``/proc``);
3. always: stop the server (SIGTERM, then a kill) and ``buildah rm`` the container.

``podman run`` / ``docker run`` cannot run containers on these machines (crun cannot set
rlimits in this sandbox); where Docker works, ``docker run -p 8000:8000 IMAGE`` is the same test.
Exits 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def image_config(image: str) -> dict:
    """The image's OCI config (Entrypoint, Cmd, User, Env) as buildah reports it."""
    out = subprocess.run(["buildah", "inspect", "--type", "image", image], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return json.loads(out)["OCIv1"]["config"]


def listening_pid(port: int) -> int | None:
    """The pid of the process with a socket listening on TCP ``port`` (from /proc), or ``None``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(pid)
        except OSError:  # the process went away, or is not ours to read
            continue
    return None


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])  # the real uid
    raise RuntimeError(f"no Uid line for pid {pid}")


def check(image: str, start_timeout: float) -> list[tuple[str, bool, str]]:
    import openai

    config = image_config(image)
    argv = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
    if not argv:
        raise RuntimeError(f"{image} has neither ENTRYPOINT nor CMD")
    user = config.get("User", "")
    port = free_port()
    argv += ["--host", "127.0.0.1", "--port", str(port)]  # argparse: the last --host/--port win
    name = f"llmrs-container-test-{os.getpid()}"
    results: list[tuple[str, bool, str]] = []
    subprocess.run(["buildah", "from", "--pull-never", "--name", name, image], check=True, capture_output=True,
                   timeout=120)
    log = tempfile.TemporaryFile()
    proc = None
    server_pid = None
    try:
        proc = subprocess.Popen(["buildah", "run", "--isolation", "chroot", name, "--", *argv],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + start_timeout
        started = time.monotonic()
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(url + "/ready", timeout=2.0, trust_env=False).status_code
                if status == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        waited = time.monotonic() - started
        if status != 200:
            results.append(("/ready is 200", False, f"last status {status}"))
            return results
        health = httpx.get(url + "/health", timeout=2.0, trust_env=False).status_code
        results.append(("/ready, /health 200", health == 200, f"ready after {waited:.1f} s; /health {health}"))
        if health != 200:
            return results
        server_pid = listening_pid(port)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120.0)
        model = client.models.list().data[0].id
        r = client.chat.completions.create(model=model, max_tokens=24, temperature=0,
                                           messages=[{"role": "user", "content": "What is the capital of France?"}])
        text = r.choices[0].message.content or ""
        results.append(("chat completion", bool(text.strip()) and r.usage.completion_tokens > 0,
                        f"{model}: {text.strip()[:60]!r} ({r.usage.completion_tokens} tokens)"))
        if server_pid is None:
            results.append(("runs as non-root", False, f"no process found listening on port {port}"))
        else:
            uid = uid_of(server_pid)
            want = user.split(":")[0]
            ok = uid != 0 and (not want.isdigit() or uid == int(want))
            results.append(("runs as non-root", ok, f"pid {server_pid} has uid {uid} (image USER {user!r})"))
        return results
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # buildah run and the server, started in a session of their own
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(20)
        if server_pid is not None and Path(f"/proc/{server_pid}").exists():
            os.kill(server_pid, signal.SIGKILL)  # the server, if it outlived buildah run
        subprocess.run(["buildah", "rm", name], capture_output=True, timeout=120)
        if not all(ok for _, ok, _ in results) or len(results) < 3:
            log.seek(0)
            tail = log.read().decode("utf-8", "replace").strip().splitlines()[-15:]
            print("the container's output (last lines):\n  " + "\n  ".join(tail), file=sys.stderr)
        log.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("image", nargs="?", default="localhost/llmrs:latest")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds for /ready to turn 200")
    args = p.parse_args(argv)
    start = time.monotonic()
    results = check(args.image, args.start_timeout)
    for what, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {what:<18} {detail}")
    passed = len(results) == 3 and all(ok for _, ok, _ in results)
    print(f"make container-test: {'passed' if passed else 'FAILED'} in {time.monotonic() - start:.0f} s")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
