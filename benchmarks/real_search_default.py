"""The search default through the real commands: ``tvr index`` (no model option) + ``tvr eval-search`` on the two
shared real sets and on both pooled, with captions and with paraphrases, compared metric by metric with the row of
``benchmarks/results/real_search_quality.json`` that the default was chosen from (its ``selection`` winner).

The pooled gallery is a scratch folder of copies of both sets' clips (tvr index skips links that leave the folder).
Indexes are kept in ``--work``: a second run updates them incrementally (nothing re-embedded when nothing changed).

    python benchmarks/real_search_default.py            # writes benchmarks/results/real_search_default.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tvr.utils.io import atomic_write_json  # noqa: E402

SHARED = Path(os.environ.get("TVR_SHARED_DATA", ROOT.parent / "shared" / "data"))
QUALITY = ROOT / "benchmarks" / "results" / "real_search_quality.json"
OUT = ROOT / "benchmarks" / "results" / "real_search_default.json"
#: real-scenes has no paraphrase column: the benchmark's own paraphrases (written for it)
PARAPHRASES = ROOT / "benchmarks" / "data" / "real_scenes_paraphrases.csv"
TVR = [sys.executable, "-m", "tvr.cli"]


def labelled_queries(folder: Path) -> dict[str, list[tuple[str, str]]]:
    """``{"caption": [(query, video)], "paraphrase": [...]}`` of one shared set."""
    with open(folder / "captions.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    queries = {"caption": [(row["caption"], row["video"]) for row in rows]}
    if all(row.get("paraphrase") for row in rows):
        queries["paraphrase"] = [(row["paraphrase"], row["video"]) for row in rows]
    else:
        with open(PARAPHRASES, newline="", encoding="utf-8") as handle:
            queries["paraphrase"] = [(row["paraphrase"], row["video"]) for row in csv.DictReader(handle)]
    return queries


def write_queries(path: Path, queries: list[tuple[str, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["query", "video"])
        writer.writerows(queries)
    return path


def cpu_of_children() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/tvr-real-search-default"), help="indexes, queries")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    quality = json.loads(QUALITY.read_text())
    chosen = quality["selection"][0]
    benchmark = next(row for row in quality["rows"] if row["label"] == chosen["label"])["metrics"]

    sets = {name: SHARED / name for name in ("real-scenes", "real-scenes-2")}
    pooled = args.work / "pooled-clips"
    pooled.mkdir(exist_ok=True)
    for folder in sets.values():
        for clip in sorted(folder.glob("*.mp4")):
            if not (pooled / clip.name).exists():
                shutil.copy2(clip, pooled / clip.name)
    queries = {name: labelled_queries(folder) for name, folder in sets.items()}
    queries["pooled"] = {kind: [q for name in sets for q in queries[name][kind]] for kind in ("caption", "paraphrase")}
    galleries = {**sets, "pooled": pooled}

    load_before, wall, cpu = os.getloadavg(), time.perf_counter(), cpu_of_children()
    columns, commands = {}, []
    for name, folder in galleries.items():
        index = args.work / f"{name}.idx"
        command = [*TVR, "index", str(folder), "--out", str(index)]
        commands.append(command)
        subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for kind, rows in queries[name].items():
            file = write_queries(args.work / f"{name}-{kind}.csv", rows)
            command = [*TVR, "eval-search", str(index), str(file), "--json"]
            commands.append(command)
            done = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
            measured = json.loads(done.stdout)["metrics"]
            expected = benchmark[f"{name}/{kind}"]
            columns[f"{name}/{kind}"] = {
                "eval_search": measured,
                "benchmark_row": expected,
                "same_to_the_digit": all(measured[m] == expected[m] for m in expected),
            }
            print(f"{name}/{kind}: {measured} (benchmark {expected})", flush=True)

    record = {
        "command": "python benchmarks/real_search_default.py",
        "default_row": chosen["label"],
        "commands": [" ".join(["tvr", *c[3:]]) for c in commands],
        "columns": columns,
        "all_same_to_the_digit": all(c["same_to_the_digit"] for c in columns.values()),
        "seconds": round(time.perf_counter() - wall, 1),
        "cpu_seconds_of_commands": round(cpu_of_children() - cpu, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    atomic_write_json(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k not in ("columns", "commands")}, indent=2))


if __name__ == "__main__":
    main()
