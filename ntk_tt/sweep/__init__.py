"""The paper's evaluation (Sec. 5, App. B; METHOD.md §8) as resumable, jit-compiled sweeps.

grid (tasks × configurations, κ-based learning rates) → run (one kernel per task,
``jit(vmap)`` predictions, real fine-tunes) → crash-safe results table → summary and figures
drawn from the table alone. The command-line shell is ``experiments/sweep.py``.
"""

from ntk_tt.sweep._figures import make_figures as make_figures
from ntk_tt.sweep._grid import Config as Config
from ntk_tt.sweep._grid import SweepSpec as SweepSpec
from ntk_tt.sweep._grid import Task as Task
from ntk_tt.sweep._grid import plan as plan
from ntk_tt.sweep._grid import row_id as row_id
from ntk_tt.sweep._summary import summarize as summarize
from ntk_tt.sweep._table import ResultsTable as ResultsTable
from ntk_tt.sweep._table import read_table as read_table
