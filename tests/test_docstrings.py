"""The house standard for public docstrings: every public function and class of
``ntk_tt.__all__`` names its source in a ``Source:`` paragraph (paper section / equation,
METHOD.md section, or what it is when the papers do not contain it), and every public
function says what it raises in a ``Raises:`` section (classes, exceptions and warnings
included, are exempt from ``Raises:``). Reading the docstrings imports every module.
"""

import inspect
import re

import ntk_tt

SOURCE = re.compile(r"^Source: \S", re.M)  # a paragraph of its own, at a line's start
RAISES = re.compile(r"^Raises:$", re.M)  # the Google-style section header


def _public() -> dict[str, object]:
    """The public functions and classes (not the constants such as ``REASONS``)."""
    objects = {name: getattr(ntk_tt, name) for name in ntk_tt.__all__}
    return {name: obj for name, obj in objects.items()
            if inspect.isclass(obj) or inspect.isfunction(obj)}


def test_the_public_names_are_found():
    public = _public()
    assert {"predict", "training_time", "Prediction", "NTKMemoryError"} <= set(public)
    assert "REASONS" not in public and len(public) > 100


def test_every_public_function_and_class_names_its_source():
    missing = sorted(name for name, obj in _public().items()
                     if not SOURCE.search(inspect.getdoc(obj) or ""))
    assert missing == [], f"add a 'Source:' paragraph to these docstrings: {missing}"


def test_every_public_function_has_a_raises_section():
    missing = sorted(name for name, obj in _public().items()
                     if not inspect.isclass(obj) and not RAISES.search(inspect.getdoc(obj) or ""))
    assert missing == [], f"add a 'Raises:' section to these docstrings: {missing}"
