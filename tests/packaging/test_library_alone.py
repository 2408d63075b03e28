"""The in-job library installs on its own (model/pyproject.toml) and protects a plain loop.

A user who wants the three-line integration in their own project or training image installs
`stabilizer-sentinel`: the packages `stabilizer_sentinel` and `stabilizer_contract`, requiring
torch and NumPy and nothing of AWS. Here it is built from the checkout, installed into a fresh
virtualenv outside the repository, and a diverging plain loop with the three lines is run there:
it must be stopped by the installed library, which may import nothing beyond the standard library,
torch and NumPy (compared with the same problem trained without it).
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from tests.packaging.support import ROOT, build_wheel, copy_tree, fresh_environment, wheel_names, wheel_requirements

pytestmark = pytest.mark.slow


# Runs the user's script as `python plain_loop.py ...` would, and at exit reports where the library
# came from and every top-level module the process imported.
RUN_AND_REPORT = """
import atexit, json, runpy, sys
def report():
    import stabilizer_sentinel
    print(json.dumps({"library": stabilizer_sentinel.__file__,
                      "modules": sorted({n.split(".")[0] for n in sys.modules})}), file=sys.stderr)
atexit.register(report)
sys.argv = ["plain_loop.py", "--lr", "3", "--steps", "8"]
runpy.run_path("plain_loop.py", run_name="__main__")
"""
# The same problem trained without the library: what torch and NumPy import by themselves.
WITHOUT_THE_LIBRARY = """
import json, sys
import numpy, torch
from problem import regression
x, y, model, optimizer = regression(3.0)
loss = torch.nn.functional.mse_loss(model(x), y)
loss.backward()
optimizer.step()
print(json.dumps(sorted({n.split(".")[0] for n in sys.modules})))
"""


def test_the_library_installs_alone_and_stops_a_diverging_three_line_loop(tmp_path):
    source = copy_tree(["model/pyproject.toml", "model/stabilizer_sentinel", "model/stabilizer_contract"],
                       tmp_path / "checkout")
    wheel = build_wheel(source / "model", tmp_path / "wheels")
    required = [r for r in wheel_requirements(wheel) if "extra ==" not in r]  # extras: the Lightning callback
    assert sorted(re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in required) == ["numpy", "torch"]
    tops = {name.split("/")[0] for name in wheel_names(wheel) if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"stabilizer_sentinel", "stabilizer_contract"}

    environment = fresh_environment(tmp_path / "env", wheel)
    job = tmp_path / "job"
    job.mkdir()
    for name in ("plain_loop.py", "problem.py"):  # a user's loop with the three lines, and its problem
        (job / name).write_text((ROOT / "tests" / "fixtures" / "regression" / name).read_text())
    result = environment.run([str(environment.python), "-c", RUN_AND_REPORT], cwd=job,
                             STABILIZER_CHECKPOINT_DIR=str(job / "checkpoints"),
                             STABILIZER_FAILURE_FILE=str(job / "failure"))
    assert result.returncode == 86, result.stdout + result.stderr
    assert (job / "failure").read_text().startswith("RuleStop: ExplodingTensor")
    [finding] = json.loads((job / "checkpoints" / "findings.json").read_text())["findings"]
    assert finding["rule"] == "ExplodingTensor"
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["library"].startswith(str(environment.root))
    plain = environment.run([str(environment.python), "-c", WITHOUT_THE_LIBRARY], cwd=job)
    assert plain.returncode == 0, plain.stderr
    baseline = set(json.loads(plain.stdout.strip().splitlines()[-1]))
    added = set(report["modules"]) - baseline - set(sys.stdlib_module_names)
    assert added - {"__mp_main__"} <= {"stabilizer_sentinel", "stabilizer_contract"}, added
