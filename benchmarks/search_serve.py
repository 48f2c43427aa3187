"""Many users on one ``tvr serve``: concurrent clients against one-at-a-time serving and micro-batched serving, side
by side in one run.

Servers are started in turn on the same index: ``one_at_a_time`` (``create_app(index, micro_batch=False)``: every
query waits for the one before, as before micro-batching), ``micro_batched`` (the default: one text-encoder pass per
tick for the queries that arrived, by one worker per core, tvr.search.batching) and ``micro_batched_one_worker``
(the same with one worker: what batching alone gives, without the second core). Against each, ``--clients`` threads
each keep one HTTP connection and send ``GET /api/search?q=...&k=10`` back to back for ``--seconds``, cycling
through the captions of the index's folder (each client starts at another caption). Recorded per server:
requests per second, p50 / p95 / max latency, the server's CPU per request, the micro-batcher's mean batch size, and
whether every answer equals the one-at-a-time server's answer to the same query (its answers are serial queries'
answers). The modes alternate for ``--rounds`` rounds so that drift in the machine's load hits both alike; the
load average is recorded.

    python benchmarks/search_serve.py                     # indexes ../shared/data/real-scenes-2 first
    python benchmarks/search_serve.py --index ~/videos.idx --clients 20 --seconds 30 --rounds 2

Writes benchmarks/results/search_serve.json.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.measure import index_to_measure  # noqa: E402
from tvr.utils.io import atomic_write_json  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "search_serve.json"
SHARED = Path(os.environ.get("TVR_SHARED_DATA", ROOT.parent / "shared" / "data"))

SERVER = """
import json, signal, sys, uvicorn
from tvr.search import open_index
from tvr.search.server import create_app
index, workers, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])  # workers: -1 = the default, 0 = no batching
opened = open_index(index)
# the media folder named (the index's own: this script serves no video), so an --index built elsewhere serves too
app = create_app(
    opened, micro_batch=workers != 0, query_workers=None if workers < 0 else workers, media_root=opened.root
)
signal.signal(signal.SIGTERM, lambda *_: None)  # uvicorn re-raises the SIGTERM it stopped on: live to print the counts
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
batcher = app.state.batcher
counts = {"batches": batcher.batches, "queries": batcher.queries, "workers": batcher.workers} if batcher else {}
print(json.dumps(counts), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(connection: http.client.HTTPConnection, text: str, k: int) -> tuple[int, bytes]:
    connection.request("GET", "/api/search?" + urllib.parse.urlencode({"q": text, "k": k}))
    response = connection.getresponse()
    return response.status, response.read()


#: the servers compared: the micro-batcher's workers (-1: its default, one per core; 0: no micro-batching)
MODES = {"one_at_a_time": 0, "micro_batched": -1, "micro_batched_one_worker": 1}


def start_server(index: Path, workers: int, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(index), str(workers), str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,  # its one line at exit: the micro-batcher's counts
        text=True,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            if get(connection, "warm up", 1)[0] == 200:
                connection.close()
                return process, port
        except OSError:
            time.sleep(0.2)
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
    process.kill()
    raise SystemExit("the server did not start within 600 s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a running process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(port: int, texts: list[str], clients: int, seconds: float, k: int) -> dict:
    """``clients`` threads sending queries back to back for ``seconds``; latencies and every answer by query."""
    latencies: list[float] = []
    answers: dict[str, set[bytes]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    start_line = threading.Barrier(clients + 1)
    stop = [0.0]

    def client(number: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        start_line.wait()
        position = number * 7
        mine, seen = [], []
        while time.perf_counter() < stop[0]:
            text = texts[position % len(texts)]
            position += 1
            began = time.perf_counter()
            status, body = get(connection, text, k)
            mine.append(time.perf_counter() - began)
            if status != 200:
                with lock:
                    errors.append(f"{status}: {body[:200]!r}")
            seen.append((text, body))
        connection.close()
        with lock:
            latencies.extend(mine)
            for text, body in seen:
                answers.setdefault(text, set()).add(body)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    stop[0] = began + seconds
    start_line.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    latencies.sort()

    def quantile(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1)

    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 2),
        "requests_per_s": round(len(latencies) / elapsed, 2),
        "p50_ms": quantile(0.50),
        "p95_ms": quantile(0.95),
        "max_ms": round(latencies[-1] * 1000, 1),
        "errors": errors[:5],
        "answers": answers,
    }


def summary(rounds: list[dict]) -> dict:
    requests = sum(r["requests"] for r in rounds)
    return {
        "requests_per_s": round(requests / sum(r["seconds"] for r in rounds), 2),
        "p95_ms_worst_round": max(r["p95_ms"] for r in rounds),
        "server_cpu_ms_per_request": round(1000 * sum(r["server_cpu_s"] for r in rounds) / max(1, requests), 2),
    }


def captions_of(folder: Path) -> list[str]:
    with open(folder / "captions.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [row["caption"] for row in rows] + [row["paraphrase"] for row in rows if row.get("paraphrase")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, help="an index (default: index --videos into a scratch folder)")
    parser.add_argument("--videos", type=Path, default=SHARED / "real-scenes-2", help="clips with a captions.csv")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"servers to compare, comma-separated, from {', '.join(MODES)} (one_at_a_time is always run)",
    )
    args = parser.parse_args()
    modes = ["one_at_a_time", *(m for m in dict.fromkeys(args.modes.split(",")) if m != "one_at_a_time")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")

    index, env = index_to_measure(args.index, args.videos, "tvr-search-serve-")
    texts = captions_of(args.videos)
    load_before = os.getloadavg()
    rounds = []
    reference: dict[str, set[bytes]] = {}
    batched: dict[str, set[bytes]] = {}
    for round_number in range(args.rounds):
        for mode in modes:
            micro_batch = MODES[mode] != 0
            process, port = start_server(index, MODES[mode], env)
            try:
                cpu_before, clients_cpu_before = cpu_seconds(process.pid), time.process_time()
                result = load(port, texts, args.clients, args.seconds, args.k)
                # the client threads share the machine with the server: their CPU says how much of it they took
                result["clients_cpu_s"] = round(time.process_time() - clients_cpu_before, 2)
                # the server's CPU per answer: what a quiet machine's throughput follows (cores / CPU per answer)
                server_cpu = cpu_seconds(process.pid) - cpu_before
                result["server_cpu_s"] = round(server_cpu, 2)
                result["server_cpu_ms_per_request"] = round(1000 * server_cpu / max(1, result["requests"]), 2)
            finally:
                process.terminate()
                out, _ = process.communicate(timeout=60)
            counts = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            if counts:  # less the warm-up query's batch
                result["mean_batch"] = round((counts["queries"] - 1) / max(1, counts["batches"] - 1), 2)
                result["workers"] = counts["workers"]
            answers = result.pop("answers")
            for text, bodies in answers.items():
                (batched if micro_batch else reference).setdefault(text, set()).update(bodies)
            rounds.append({"round": round_number, "mode": mode, "micro_batch": micro_batch, **result})
            print(json.dumps(rounds[-1]), flush=True)
    # every answer of the batched server is the one-at-a-time server's (serial) answer to the same query
    compared = [text for text in batched if text in reference]
    identical = all(len(reference[t]) == 1 and batched[t] == reference[t] for t in compared)
    record = {
        "index": str(index),
        "clients": args.clients,
        "seconds_per_round": args.seconds,
        "k": args.k,
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "rounds": rounds,
        **{mode: summary([r for r in rounds if r["mode"] == mode]) for mode in modes},
        "answers_identical_to_serial": identical,
        "queries_compared": len(compared),
    }
    one = record["one_at_a_time"]
    for mode in modes[1:]:  # throughput_ratio / cpu_ratio: micro_batched's, as before; the others' with a suffix
        suffix = mode.removeprefix("micro_batched")
        record[f"throughput_ratio{suffix}"] = round(record[mode]["requests_per_s"] / one["requests_per_s"], 2)
        record[f"cpu_ratio{suffix}"] = round(
            one["server_cpu_ms_per_request"] / record[mode]["server_cpu_ms_per_request"], 2
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "rounds"}, indent=2))


if __name__ == "__main__":
    main()
