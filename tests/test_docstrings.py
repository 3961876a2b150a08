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


# A parameter is named as a label: ``name:`` (or ``name (shape):``) at the start of an indented
# line of the ``Args:`` section or after a sentence's ". " / "; " in it, alone or in a list
# ``a, b:`` that may wrap (the house form of short parameters, e.g. ``adam``'s ``b1, b2:``).
ARGS = re.compile(r"^Args:\n((?:[ \t]+\S.*\n?|\n)*)", re.M)
LABEL = re.compile(r"(?:^[ \t]+|[.;] )((?:\*{0,2}\w+,\s+)*\*{0,2}\w+)(?: \([^()]*\))?:(?=\s)", re.M)
RETURNS = re.compile(r"^(Returns|Yields):", re.M)


def _undocumented(obj) -> set[str]:
    """The parameters of ``obj`` (``*args``/``**kwargs`` excepted) its ``Args:`` does not name."""
    doc = inspect.getdoc(obj) or ""
    section = ARGS.search(doc)
    named = {n.strip().lstrip("*") for m in LABEL.finditer(section.group(1) if section else "")
             for n in m.group(1).split(",")}
    return {p.name for p in inspect.signature(obj).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in named}


def test_every_public_function_documents_its_args_and_returns():
    functions = {n: f for n, f in _public().items() if not inspect.isclass(f)}
    problems = []
    for name, f in sorted(functions.items()):
        if params := sorted(_undocumented(f)):
            problems.append(f"{name}: Args lacks {params}")
        if not RETURNS.search(inspect.getdoc(f) or ""):
            problems.append(f"{name}: no 'Returns:' (or 'Yields:') section")
    assert problems == [], f"{len(problems)} docstring gaps: {problems}"
