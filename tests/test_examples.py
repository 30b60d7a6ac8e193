"""Every example runs on the CPU (``--device -1``) at tiny sizes for two iterations.

The examples are run as a user runs them, in a subprocess; on the CPU they
cannot show GPU memory, so these tests check that they run the whole path
(pool made, extension installed, iterations marked) and say ``n/a (CPU)``
instead of printing numbers they do not have.  The small-size commands of
``examples/README.rst`` run as written there, in the venv its set-up line makes.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from pgmo import _chainer_compat

from .example_modules import EXAMPLES, load_example


pytest.importorskip("cupy")
_chainer_compat.apply()
pytest.importorskip("chainer")

pytestmark = pytest.mark.chainer


def run_example(script, *args, timeout=300):
    """Run ``examples/<script>`` with ``args``; return its output, failing on a non-zero exit."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *map(str, args)],
                            capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, \
        f"{script} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


#: No GPU for CuPy to see, on any machine: what a newcomer without one gets.
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}

#: Each example at its smallest, for a run of two iterations.
SMALL = {
    "one_liner.py": ["--iterations", 2, "--batchsize", 8, "--inputs", 32, "--hidden", 16,
                     "--classes", 4],
    "train_imagenet.py": ["--arch", "alexnet", "--insize", 39, "--batchsize", 2,
                          "--iterations", 2, "--classes", 10],
    "seq2seq.py": ["--vocab", 50, "--units", 16, "--layers", 1, "--batchsize", 4,
                   "--iterations", 2, "--translate", 2],
    "densenet.py": ["--depth", 10, "--growth-rate", 4, "--insize", 8, "--batchsize", 2,
                    "--iterations", 2],
}


def run_script(script, *args, env=None, timeout=300):
    """Run ``examples/<script>``; return the finished process, whatever its exit status."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("script", sorted(SMALL))
def test_without_a_gpu_every_example_runs_on_the_cpu_with_a_one_line_note(script):
    done = run_script(script, *SMALL[script], env=NO_GPU)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    first = done.stdout.splitlines()[0]
    assert re.fullmatch(r"No GPU seen by CuPy \(.+\): running on the CPU, as --device -1 "
                        r"does\.", first), first
    assert "Traceback" not in done.stderr and "n/a (CPU)" in done.stdout


@pytest.mark.parametrize("script", sorted(SMALL) + ["train_mn.py"])
def test_a_gpu_cupy_cannot_see_stops_the_example_with_one_line(script):
    done = run_script(script, "--device", 0, env=NO_GPU, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"{script}: --device 0: CuPy sees no GPU (")
    assert done.stderr.rstrip().endswith("run on the CPU with --device -1")


@pytest.mark.parametrize("script", sorted(SMALL) + ["train_mn.py"])
def test_help_says_which_device_runs_by_default(script):
    done = run_script(script, "--help", timeout=120)
    assert done.returncode == 0
    said = " ".join(done.stdout.split())
    assert re.search(r"\(default: (GPU )?0 when CuPy sees a GPU, else (the CPU|-1), with a "
                     r"note\)", said), said


def summary_rows(output):
    """The summary table's rows, split on runs of spaces."""
    table = output[output.index("Summary"):].splitlines()
    rules = [i for i, line in enumerate(table) if line.startswith("---")]
    return [re.split(r"\s{2,}", line.strip()) for line in table[rules[1] + 1:rules[2]]]


def iteration_lines(output, title):
    """The ``iter N ...`` lines printed under the run whose heading starts with ``title``."""
    part = output[output.index(title):]
    part = part[:part.index("\n\n")] if "\n\n" in part else part
    return [line for line in part.splitlines() if line.strip().startswith("iter ")]


def test_one_liner_on_cpu():
    out = run_example("one_liner.py", "--device", -1, "--iterations", 2, "--batchsize", 8,
                      "--inputs", 32, "--hidden", 16, "--classes", 4)
    assert len(iteration_lines(out, "pool stock")) == 2
    pgmo_lines = iteration_lines(out, "pool pgmo")
    # NumPy never asks the pool for memory: no mode to show, not "profiling" forever
    assert len(pgmo_lines) == 2 and all("n/a (CPU)   pools" in line for line in pgmo_lines)
    assert "profiling" not in out
    rows = summary_rows(out)
    assert [row[:2] for row in rows] == [["stock", "2"], ["pgmo", "2"]]
    assert rows[1][2:5] == ["n/a (CPU)"] * 3  # no GPU bytes to show, and none made up


# Smallest inputs each model accepts keep the CPU runs short.
TINY = {"alexnet": 39, "googlenet": 32, "resnet50": 32, "inception-resnet-v2": 75}


@pytest.mark.parametrize("arch", sorted(TINY))
def test_train_imagenet_trains_every_arch_with_pgmo_on_cpu(arch):
    out = run_example("train_imagenet.py", "--arch", arch, "--pool", "pgmo", "--device", -1,
                      "--batchsize", 2, "--iterations", 2, "--classes", 10,
                      "--insize", TINY[arch])
    lines = iteration_lines(out, f"{arch}, train, pool pgmo")
    assert [line.split()[1] for line in lines] == ["1", "2"]
    assert all(np.isfinite(float(line.split()[3])) for line in lines)  # the loss
    [row] = summary_rows(out)
    assert row[:7] == [arch, "pgmo", "train", "2", "2", "n/a (CPU)", "n/a (CPU)"]
    assert float(row[7]) > 0  # ms per iteration
    assert row[8:] == ["n/a (CPU)", "n/a (CPU)"]  # pgmo's mode and counts mean nothing here


def test_train_imagenet_stock_and_pgmo_inference_on_cpu():
    out = run_example("train_imagenet.py", "--arch", "googlenet", "--inference",
                      "--pool", "stock", "pgmo", "--device", -1, "--iterations", 2,
                      "--classes", 10, "--insize", 32)
    rows = summary_rows(out)
    assert [row[:5] for row in rows] == [["googlenet", "stock", "inference", "1", "2"],
                                         ["googlenet", "pgmo", "inference", "1", "2"]]
    lines = iteration_lines(out, "googlenet, inference, pool pgmo")
    assert len(lines) == 2 and all("n/a (CPU)   pools" in line for line in lines)
    assert "profiling" not in out


def test_train_imagenet_rejects_an_input_too_small_for_the_model():
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_imagenet.py"),
                             "--arch", "inception-resnet-v2", "--insize", "64", "--device", "-1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--insize 64 is too small for inception-resnet-v2 (at least 75)" in result.stderr


def test_seq2seq_trains_and_translates_on_cpu():
    out = run_example("seq2seq.py", "--device", -1, "--vocab", 50, "--units", 16, "--layers", 1,
                      "--batchsize", 4, "--iterations", 2, "--translate", 2, "--max-output", 12,
                      "--pool", "pgmo", "stock")
    # PrintReport's lines, one per iteration, for both runs; a pipe gets no escape codes
    assert "\x1b" not in out
    report = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in report] == ["1", "2", "1", "2"]
    generated = [int(m) for m in re.findall(r"out\s+(\d+)", out)]
    # At most --max-output words; an untrained decoder may emit EOS first (0 words).
    assert len(generated) == 4 and all(0 <= n <= 12 for n in generated)
    rows = summary_rows(out)
    assert [row[:4] for row in rows] == [
        ["train", "pgmo", "4", "2"], ["inference", "pgmo", "1", "2"],
        ["train", "stock", "4", "2"], ["inference", "stock", "1", "2"]]
    assert rows[0][4:8] == ["n/a (CPU)"] * 4


def test_seq2seq_synthetic_pairs_are_variable_length_and_learnable():
    seq2seq = load_example("seq2seq")
    pairs = seq2seq.synthetic_pairs(300, vocab=20, min_length=1, max_length=50, seed=3)
    lengths = [len(s) for s, _ in pairs]
    assert min(lengths) == 1 and max(lengths) == 50
    rename = {}
    for source, target in pairs:
        assert source.dtype == target.dtype == np.int32
        assert len(target) == len(source)
        assert source.min() >= 2 and source.max() < 20  # ids 0 and 1 are reserved
        for word, renamed in zip(source[::-1], target):
            assert rename.setdefault(word, renamed) == renamed  # one fixed renaming
    assert sorted(rename.values()) == sorted(rename)  # a permutation of the words


def test_seq2seq_translate_stops_at_the_length_limit_and_drops_eos():
    seq2seq = load_example("seq2seq")
    model = seq2seq.Seq2seq(vocab=12, units=8, layers=2)
    sources = [np.array([2, 3, 4], np.int32), np.array([5], np.int32)]
    outputs = model.translate(sources, max_length=7)
    assert len(outputs) == 2
    for words in outputs:
        assert len(words) <= 7 and seq2seq.EOS not in words


def test_inception_resnet_v2_layers_train_at_the_smallest_input():
    """Every kind of block learns at the smallest input; smaller inputs fail clearly."""
    sys.path.insert(0, EXAMPLES)
    try:
        from models import InceptionResNetV2
    finally:
        sys.path.remove(EXAMPLES)
    model = InceptionResNetV2(n_classes=5, repeats=(1, 1, 0))
    x = np.random.default_rng(0).standard_normal((2, 3, 75, 75), dtype=np.float32)
    assert model.forward(x).shape == (2, 5)
    loss = model(x, np.array([0, 4], np.int32))
    loss.backward()
    assert np.isfinite(float(loss.array))
    assert all(p.grad is not None for p in model.params())
    with pytest.raises(Exception, match="positive"):
        model.forward(x[:, :, :74, :74])  # below min_insize the strides leave nothing


DENSENET_TINY = ("--depth", 10, "--growth-rate", 4, "--insize", 8, "--batchsize", 2,
                 "--iterations", 2, "--classes", 5)


def test_densenet_trains_with_and_without_recomputation_on_cpu():
    out = run_example("densenet.py", "--device", -1, *DENSENET_TINY,
                      "--recompute", "off", "on", "--pool", "stock", "pgmo")
    rows = summary_rows(out)
    assert [row[:4] for row in rows] == [["off", "stock", "2", "2"], ["off", "pgmo", "2", "2"],
                                         ["on", "stock", "2", "2"], ["on", "pgmo", "2", "2"]]
    for row in rows:
        assert row[4:6] == ["n/a (CPU)"] * 2  # no GPU bytes to show, and none made up
        assert row[7:9] == (["n/a (CPU)"] * 2 if row[1] == "pgmo" else ["-", "-"])
    # Same seed, same weights and data: recomputation changes what is kept, not the losses.
    losses = {float(row[9]) for row in rows}
    assert len(losses) == 1 and np.isfinite(losses.pop())
    for heading in ("recompute off, pool pgmo", "recompute on, pool pgmo"):
        lines = iteration_lines(out, "DenseNet-BC-10 (k=4, 3 dense layers), " + heading)
        assert [line.split()[1] for line in lines] == ["1", "2"]
        assert all("n/a (CPU)   pools" in line for line in lines)
    first = [float(line.split()[3]) for line in iteration_lines(out, "DenseNet-BC-10")]
    assert first[1] != first[0]  # the model trains: the second loss is another


def test_densenet_rejects_a_depth_that_is_not_six_n_plus_four():
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES, "densenet.py"),
                             "--depth", "12", "--device", "-1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--depth must be 6 n + 4 with n >= 1 (10, 16, ..., 100), got 12" in result.stderr


@pytest.mark.gpu
def test_densenet_on_the_gpu_plans_every_combination_and_keeps_the_losses():
    # (40 iterations: a GPU runs this small net's iterations in milliseconds, and the worker
    # process that plans takes about half a second to start: 5 were not enough on an H100)
    out = run_example("densenet.py", "--device", 0, "--depth", 16, "--growth-rate", 8,
                      "--batchsize", 8, "--iterations", 40, "--method", "bestfit",
                      "--recompute", "off", "on", "--pool", "stock", "pgmo")
    rows = summary_rows(out)
    assert [row[:2] for row in rows] == [["off", "stock"], ["off", "pgmo"], ["on", "stock"],
                                         ["on", "pgmo"]]
    for row in rows:
        assert row[4].endswith(" MiB") and row[5].endswith(" MiB"), row  # measured peaks
    assert [row[7] for row in rows if row[1] == "pgmo"] == ["optimized", "optimized"]
    # cuDNN may sum in another order when it recomputes: equal to within rounding
    losses = [float(row[9]) for row in rows]
    np.testing.assert_allclose(losses, losses[0], rtol=1e-3)


# ------------------------------------------------------------------ the README's commands
README = os.path.join(EXAMPLES, "README.rst")
VENV_BIN = ".venv/bin/"


def readme_cpu_commands():
    """The lines of ``examples/README.rst``'s block of small sizes for the CPU."""
    with open(README) as file:
        text = file.read()
    block = text[text.index("Small sizes for a quick run on the CPU"):].split("::", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line.strip():
            lines.append(line.strip())
        elif lines:
            break
    return lines


def test_the_readmes_cpu_commands_run_in_the_venv_its_setup_line_makes():
    # Pasted after the README's set-up line, a bare ``python`` or ``mpiexec`` is not the venv's.
    commands = readme_cpu_commands()
    assert len(commands) == 5
    for command in commands:
        assert command.startswith(VENV_BIN), command
        assert all(word.startswith(VENV_BIN) for word in command.split()
                   if word in ("python", "python3", "mpiexec") or word.endswith("/python")
                   or word.endswith("/mpiexec")), command


@pytest.mark.parametrize("command", readme_cpu_commands(), ids=lambda c: c.split()[1])
def test_the_readmes_cpu_commands_run_as_written(command):
    """Each line, with ``.venv/bin/`` read as this Python's folder, from the repository root."""
    here = os.path.dirname(sys.executable)
    argv = [os.path.join(here, word[len(VENV_BIN):]) if word.startswith(VENV_BIN) else word
            for word in command.split()]
    if not os.path.exists(argv[0]):
        pytest.skip(f"no {os.path.basename(argv[0])} beside this Python (pgmo[mpi])")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(EXAMPLES), env=dict(os.environ,
                                                                  PYTHONWARNINGS="ignore"))
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr and "n/a (CPU)" in done.stdout
