"""The notebooks run as written (their code cells, in order, in one namespace)."""

import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_cells_run(path):
    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    assert namespace["out"].loss.shape == (8, 101)  # the learning-rate sweep ran
