"""A model repository through the unmodified tritonclient (gRPC and HTTP): a second
server (INFLIGHT_BIN) serves two models from one repository; the repository index, one
model unloaded and loaded again while the other serves a steady stream of requests, none
of which fails; then the server stops on SIGTERM and exits 0."""

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

BIN = os.environ.get("INFLIGHT_BIN")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def repo_server():
    if not BIN or not os.path.exists(BIN):
        pytest.skip("INFLIGHT_BIN names no binary (scripts/client-tests.sh sets it)")
    gguf = subprocess.run([BIN, "fetch-model"], check=True, capture_output=True, text=True).stdout.strip()
    work = tempfile.mkdtemp()
    small = "max_tokens_in_paged_kv_cache = 8192\n"
    for name, extra in [
        ("smol_a", '[model.triton_names]\nensemble = "a_ensemble"\ntensorrt_llm = "a_trtllm"\n'),
        ("smol_b", ""),
    ]:
        os.makedirs(os.path.join(work, name))
        with open(os.path.join(work, name, "config.toml"), "w") as f:
            f.write(f'[model]\npath = "{gguf}"\n{small}\n{extra}')
    http_port, metrics_port, grpc_port = free_ports(3)
    log = open(os.path.join(work, "server.log"), "w")
    proc = subprocess.Popen(
        [BIN, "serve", "--model-repository", work, "--host", "127.0.0.1", "--http-port", str(http_port),
         "--metrics-port", str(metrics_port), "--grpc-port", str(grpc_port)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
    http = f"127.0.0.1:{http_port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, open(os.path.join(work, "server.log")).read()[-2000:]
        try:
            if requests.get(f"http://{http}/v2/health/ready", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.25)
    yield {"http": http, "grpc": f"127.0.0.1:{grpc_port}", "proc": proc}
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "the repository server exits 0 on SIGTERM"


def text_infer(client, mod, model, prompt="Hello", max_tokens=4):
    ti = mod.InferInput("text_input", [1, 1], "BYTES")
    ti.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    mt = mod.InferInput("max_tokens", [1, 1], "INT32")
    mt.set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    r = client.infer(model, [ti, mt])
    return r.as_numpy("text_output").reshape(-1)[0].decode()


def test_two_models_one_unloaded_and_loaded_again_while_the_other_serves(repo_server):
    g = grpcclient.InferenceServerClient(repo_server["grpc"])
    h = httpclient.InferenceServerClient(repo_server["http"])
    index = g.get_model_repository_index(as_json=True)["models"]
    names = {m["name"]: m["state"] for m in index}
    assert names == {"smol_a": "READY", "a_ensemble": "READY", "a_trtllm": "READY", "smol_b": "READY"}
    assert g.is_model_ready("smol_a") and g.is_model_ready("smol_b")
    a = text_infer(g, grpcclient, "a_ensemble")
    assert text_infer(g, grpcclient, "smol_b") == a, "the same weights answer the same"

    statuses, stop = [], threading.Event()

    def traffic():
        c = httpclient.InferenceServerClient(repo_server["http"])
        while not stop.is_set():
            try:
                text_infer(c, httpclient, "smol_b", prompt="steady", max_tokens=3)
                statuses.append("ok")
            except InferenceServerException as e:
                statuses.append(str(e))

    t = threading.Thread(target=traffic)
    t.start()
    try:
        while len(statuses) < 3:
            time.sleep(0.01)
        g.unload_model("smol_a")
        assert not g.is_model_ready("smol_a")
        assert not h.is_model_ready("a_trtllm")
        with pytest.raises(InferenceServerException, match="unloaded"):
            text_infer(g, grpcclient, "a_ensemble")
        unavailable = {m["name"]: m.get("reason", "") for m in h.get_model_repository_index()
                       if m["state"] == "UNAVAILABLE"}
        assert unavailable.get("smol_a") == "unloaded", unavailable
        seen = len(statuses)
        while len(statuses) < seen + 3:
            time.sleep(0.01)
        h.load_model("smol_a")
        assert g.is_model_ready("smol_a")
        assert text_infer(g, grpcclient, "a_ensemble") == a
        seen = len(statuses)
        while len(statuses) < seen + 3:
            time.sleep(0.01)
    finally:
        stop.set()
        t.join(timeout=60)
    assert statuses and all(s == "ok" for s in statuses), statuses
    with pytest.raises(InferenceServerException, match="no model folder"):
        g.load_model("not_there")
    g.close()
    h.close()
