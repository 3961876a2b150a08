"""Store the fitting corpus's input ranges in the shipped outcome predictors, in place.

    python experiments/outcome_domain.py experiments/results/telemetry/corpus.jsonl.gz

Each ``ntk_tt/assets/outcome_*.json.gz`` gets a ``domain`` entry, {column: [low, high,
missing]} of the rows it was fitted on (``ntk_tt.telemetry._outcome_domain.feature_domain`` of
``dataset(corpus, ks, ntk)``, the matrix ``fit_outcome`` fits), which ``predict`` uses to flag
runs outside the corpus. Nothing else in the files changes: the fitted trees, constants and
intervals are kept as they are (checked), so no refit is needed. ``experiments/outcome.py
--ship`` writes the same entry when it refits. Also checks each range against the
minimum and maximum LightGBM recorded for the feature while fitting (``feature_infos`` of the
models fitted on every row).
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import sys

import numpy as np

from ntk_tt import read_corpus
from ntk_tt.telemetry._outcome_domain import feature_domain
from ntk_tt.telemetry._outcome_features import dataset

ASSETS = pathlib.Path(__file__).resolve().parents[1] / "ntk_tt" / "assets"


def _lightgbm_ranges(model_text: str) -> list[tuple[float, float] | None]:
    """Per feature, LightGBM's [min:max] of its training data (None: a feature it dropped)."""
    line = next(s for s in model_text.splitlines() if s.startswith("feature_infos="))
    out = []
    for item in line.split("=", 1)[1].split():
        lo, _, hi = item.strip("[]").partition(":")
        out.append(None if item == "none" else (float(lo), float(hi)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corpus")
    args = p.parse_args(argv)
    try:  # a missing corpus was a traceback
        rows = read_corpus(args.corpus)
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    for name in ("outcome_telemetry.json.gz", "outcome_ntk.json.gz"):
        path = ASSETS / name
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
        data = dataset(rows, ks=doc["ks"], ntk=doc["ntk"])
        if data.columns != doc["columns"]:
            raise SystemExit(f"{name}: the corpus's features differ from the file's columns")
        domain = feature_domain(data.x, data.columns)
        for j, rng in enumerate(_lightgbm_ranges(doc["models"]["diverged"])):
            lo, hi, _ = domain[data.columns[j]]
            if rng is not None and not np.allclose(rng, (lo, hi), rtol=1e-6):
                raise SystemExit(f"{name}: {data.columns[j]} ranges {lo}..{hi}, LightGBM "
                                 f"saw {rng}: not the corpus the file was fitted on")
        before = {k: v for k, v in doc.items() if k != "domain"}
        doc["domain"] = domain
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(json.dumps(doc))
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            back = json.load(fh)
        assert {k: v for k, v in back.items() if k != "domain"} == before
        print(f"{path}: domain of {len(domain)} inputs from {len(rows)} runs × "
              f"{len(doc['ks'])} prefixes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
