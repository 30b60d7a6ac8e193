"""A documented generator of *synthetic* training and inference traces.

Real traces are recorded by pgmo's profiling mode on a GPU.  Where none was
available, pgmo ships traces made here instead, and labels them so
(``metadata["synthetic"] = True``).  The generator mimics what a Chainer
iteration asks of the allocator, one event-clock tick per alloc and per free:

* forward: each layer allocates its output (kept for backward) and a short
  workspace freed at once;
* backward: layers in reverse allocate the input gradient and the weight
  gradient; a layer's output and the gradient flowing into it are freed once
  the layer is done;
* the optimizer update allocates one temporary per parameter, then weight
  gradients are freed at the end of the iteration.

Shapes come from real architectures' layer lists (channels, spatial size,
batch), so the sizes and lifetimes have the structure of the paper's
workloads, but the traces are not measurements.  Regenerate the bundled set
with ``python -m pgmo.synth --write-bundled``.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .formats import write_trace
from .recorder import EventRecorder
from .trace import Trace
from .units import ALIGNMENT

__all__ = ["Recorder", "cnn_training", "cnn_inference", "seq2seq_training", "seq2seq_run",
           "random_iteration", "ARCHITECTURES", "bundled_specs", "write_bundled"]

FLOAT_BYTES = 4
ROUND = ALIGNMENT  # recorded traces hold sizes rounded as CuPy rounds them


class Recorder(EventRecorder):
    """The event clock with CuPy's rounding; its traces are labelled synthetic."""

    def __init__(self) -> None:
        super().__init__(round_to=ROUND)

    def alloc(self, nbytes: int) -> int:
        return super().alloc(max(nbytes, 1))  # an empty buffer still takes one unit

    def trace(self, close_open: bool = True, **metadata: Any) -> Trace:
        """Build the trace, closing every block still live at the end of the iteration
        (``close_open``: a generated iteration frees everything it made)."""
        meta = {"synthetic": True, "recorded_by": "pgmo.synth (generator, not a measurement)"}
        meta.update(metadata)
        return super().trace(close_open=close_open, **meta)


@dataclass(frozen=True)
class Layer:
    """A layer's output shape per sample and parameter count (floats)."""

    out_elems: int  # output elements per sample
    params: int  # weights + biases
    workspace_elems: int = 0  # per-sample scratch (im2col and the like)


def _conv(c_out: int, hw: int, c_in: int, k: int) -> Layer:
    return Layer(c_out * hw * hw, c_out * c_in * k * k + c_out, c_in * k * k * hw * hw // 4)


def _alexnet() -> list[Layer]:
    return [_conv(96, 55, 3, 11), Layer(96 * 27 * 27, 0), _conv(256, 27, 96, 5),
            Layer(256 * 13 * 13, 0), _conv(384, 13, 256, 3), _conv(384, 13, 384, 3),
            _conv(256, 13, 384, 3), Layer(256 * 6 * 6, 0), Layer(4096, 9216 * 4096 + 4096),
            Layer(4096, 4096 * 4096 + 4096), Layer(1000, 4096 * 1000 + 1000)]


def _resnet50() -> list[Layer]:
    layers = [_conv(64, 112, 3, 7), Layer(64 * 56 * 56, 0)]
    c_in = 64
    for blocks, mid, out, hw in ((3, 64, 256, 56), (4, 128, 512, 28), (6, 256, 1024, 14),
                                 (3, 512, 2048, 7)):
        for _ in range(blocks):
            layers += [_conv(mid, hw, c_in, 1), Layer(mid * hw * hw, 2 * mid),
                       _conv(mid, hw, mid, 3), Layer(mid * hw * hw, 2 * mid),
                       _conv(out, hw, mid, 1), Layer(out * hw * hw, 2 * out)]
            c_in = out
    return layers + [Layer(2048, 0), Layer(1000, 2048 * 1000 + 1000)]


def _googlenet() -> list[Layer]:
    layers = [_conv(64, 112, 3, 7), Layer(64 * 56 * 56, 0), _conv(192, 56, 64, 3),
              Layer(192 * 28 * 28, 0)]
    c_in = 192
    for out, hw in ((256, 28), (480, 28), (512, 14), (512, 14), (512, 14), (528, 14),
                    (832, 14), (832, 7), (1024, 7)):
        quarter = out // 4
        for k in (1, 3, 5, 1):  # the four inception branches
            layers.append(_conv(quarter, hw, c_in, k))
        layers.append(Layer(out * hw * hw, 0))  # concat
        c_in = out
    return layers + [Layer(1024, 0), Layer(1000, 1024 * 1000 + 1000)]


def _inception_resnet_v2() -> list[Layer]:
    layers = [_conv(32, 149, 3, 3), _conv(64, 147, 32, 3), _conv(192, 71, 64, 3),
              Layer(320 * 35 * 35, 0)]
    for repeats, c, hw in ((10, 320, 35), (20, 1088, 17), (10, 2080, 8)):
        for _ in range(repeats):
            layers += [_conv(32 if hw == 35 else 192, hw, c, 1),
                       _conv(48 if hw == 35 else 192, hw, 32 if hw == 35 else 192, 3),
                       _conv(c, hw, 128, 1), Layer(c * hw * hw, 0)]
    return layers + [Layer(1536, 0), Layer(1000, 1536 * 1000 + 1000)]


ARCHITECTURES = {"alexnet": _alexnet, "googlenet": _googlenet, "resnet50": _resnet50,
                 "inception_resnet_v2": _inception_resnet_v2}


def cnn_training(arch: str, batch: int, scale: float = 1.0) -> Trace:
    """One training iteration of ``arch`` at ``batch`` (sizes times ``scale``)."""
    layers = ARCHITECTURES[arch]()
    rec = Recorder()

    def nbytes(elems: int, per_sample: bool = True) -> int:
        return int(elems * (batch if per_sample else 1) * FLOAT_BYTES * scale)

    x = rec.alloc(nbytes(3 * 224 * 224))
    outputs = [x]
    for layer in layers:
        if layer.workspace_elems:
            rec.free(rec.alloc(nbytes(layer.workspace_elems)))
        outputs.append(rec.alloc(nbytes(layer.out_elems)))
    loss = rec.alloc(FLOAT_BYTES)
    grad = rec.alloc(nbytes(layers[-1].out_elems))
    wgrads = []
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        gin = rec.alloc(nbytes(layers[i - 1].out_elems if i else 3 * 224 * 224))
        if layer.params:
            wgrads.append(rec.alloc(nbytes(layer.params, per_sample=False)))
        if layer.workspace_elems:
            rec.free(rec.alloc(nbytes(layer.workspace_elems)))
        rec.free(outputs[i + 1])
        rec.free(grad)
        grad = gin
    rec.free(grad)
    rec.free(outputs[0])
    rec.free(loss)
    for w in wgrads:  # optimizer: one temporary per parameter, then grads are cleared
        rec.free(rec.alloc(rec.size(w)))
        rec.free(w)
    return rec.trace(model=arch, batch_size=batch, kind="training", scale=scale)


def cnn_inference(arch: str, batch: int = 1, scale: float = 1.0) -> Trace:
    """One forward pass: each output lives until the next layer has used it."""
    layers = ARCHITECTURES[arch]()
    rec = Recorder()
    prev = rec.alloc(int(3 * 224 * 224 * batch * FLOAT_BYTES * scale))
    for layer in layers:
        if layer.workspace_elems:
            rec.free(rec.alloc(int(layer.workspace_elems * batch * FLOAT_BYTES * scale)))
        out = rec.alloc(int(layer.out_elems * batch * FLOAT_BYTES * scale))
        rec.free(prev)
        prev = out
    rec.free(prev)
    return rec.trace(model=arch, batch_size=batch, kind="inference", scale=scale)


def seq2seq_training(batch: int = 64, hidden: int = 512, vocab: int = 4000, layers: int = 3,
                     seed: int = 0, max_len: int = 50) -> Trace:
    """One NStepLSTM encoder-decoder iteration on sentences of random length 1..max_len."""
    rng = random.Random(seed)
    src_len, tgt_len = rng.randint(1, max_len), rng.randint(1, max_len)
    rec = Recorder()
    step = batch * hidden * FLOAT_BYTES
    saved = []
    for length in (src_len, tgt_len):  # encoder then decoder
        for _ in range(layers):
            xs = rec.alloc(step * length)
            hx, cx = rec.alloc(step), rec.alloc(step)
            saved += [xs, hx, cx, rec.alloc(4 * step * length)]  # gates kept for backward
    _softmax_and_backward(rec, saved, batch * tgt_len * vocab * FLOAT_BYTES, workspace=False)
    return rec.trace(model="seq2seq", batch_size=batch, kind="training", seed=seed,
                     src_len=src_len, tgt_len=tgt_len)


def _softmax_and_backward(rec: EventRecorder, saved: list[int], logits_bytes: int,
                          workspace: bool) -> None:
    """The output layer's logits and loss, then backward through ``saved`` in reverse:
    each kept array's gradient is made, then both are freed."""
    logits = rec.alloc(logits_bytes)
    if workspace:
        rec.free(rec.alloc(logits_bytes))  # softmax's workspace
    loss = rec.alloc(FLOAT_BYTES)
    glogits = rec.alloc(logits_bytes)
    rec.free(logits)
    for handle in reversed(saved):
        grad = rec.alloc(rec.size(handle))
        rec.free(handle)
        rec.free(grad)
    rec.free(glogits)
    rec.free(loss)


def seq2seq_run(iterations: int = 30, batch: int = 64, hidden: int = 512, vocab: int = 4000,
                layers: int = 3, seed: int = 0, max_len: int = 50):
    """A whole variable-length run (:class:`~pgmo.runs.Run`): a step-by-step LSTM
    encoder-decoder on sentences of random length 1..``max_len``.

    Unlike :func:`seq2seq_training`, each time step allocates its own gates and
    states, as Chainer's LSTM without cuDNN does, so iterations differ in
    their number of requests, not only in sizes: request ``i`` is another
    tensor in each.  Weights are made in the first iteration, gradients at
    each update, and the optimizer's two states (Adam) at the first one.
    """
    from .runs import RunRecorder

    rng = random.Random(seed)
    rec = RunRecorder(round_to=ROUND)
    step = batch * hidden * FLOAT_BYTES
    weights: list[int] = []
    for it in range(iterations):
        rec.begin()
        if it == 0:
            shapes = [vocab * hidden] * 2 + [8 * hidden * hidden] * (2 * layers) + [
                hidden * vocab, vocab]
            weights = [rec.alloc(n * FLOAT_BYTES) for n in shapes]
        saved = []
        tgt = 1
        for length in (rng.randint(1, max_len), rng.randint(1, max_len)):  # encoder, decoder
            saved.append(rec.alloc(step * length))  # embedded words
            for _ in range(layers * length):
                saved += [rec.alloc(4 * step), rec.alloc(step), rec.alloc(step)]  # gates, h, c
            tgt = length
        _softmax_and_backward(rec, saved, batch * tgt * vocab * FLOAT_BYTES, workspace=True)
        grads = [rec.alloc(rec.size(w)) for w in weights]
        if it == 0:
            for w in weights:
                rec.alloc(rec.size(w))
                rec.alloc(rec.size(w))
        for g in grads:
            rec.free(g)
        rec.end()
    return rec.run(synthetic=True, recorded_by="pgmo.synth.seq2seq_run (generator, not a "
                   "measurement)", model="seq2seq", batch_size=batch, seed=seed)


def random_iteration(seed: int, n: int = 60) -> Trace:
    """A random iteration of ``n`` requests, as the pool records one: no model behind it.

    Sizes are multiples of 512 B with small factors; allocs and frees
    interleave at random (each live block equally likely to go next).  Good
    for packing problems where the paper's best-fit is far from the lower
    bound, which real training traces rarely are.
    """
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 3, 5, 8, 13]) * ROUND * rng.randint(1, 8) for _ in range(n)]
    rec = Recorder()
    live: list[int] = []
    while len(rec) < n or live:
        if len(rec) < n and (not live or rng.random() < 0.55):
            live.append(rec.alloc(sizes[len(rec)]))
        else:
            rec.free(live.pop(rng.randrange(len(live))))
    return rec.trace(generator="pgmo.synth.random_iteration", seed=seed)


def bundled_specs() -> dict[str, Callable[[], Trace]]:
    """Name -> generator of every trace shipped in ``pgmo/traces``."""
    return {
        "synthetic-alexnet-train-b32": lambda: cnn_training("alexnet", 32),
        "synthetic-googlenet-train-b32": lambda: cnn_training("googlenet", 32),
        "synthetic-resnet50-train-b32": lambda: cnn_training("resnet50", 32),
        "synthetic-inception_resnet_v2-train-b32":
            lambda: cnn_training("inception_resnet_v2", 32),
        "synthetic-resnet50-infer-b1": lambda: cnn_inference("resnet50", 1),
        "synthetic-seq2seq-train-b64": lambda: seq2seq_training(64, seed=0),
    }


def write_bundled(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in bundled_specs().items():
        path = directory / f"{name}.json.gz"
        write_trace(make(), path)
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-bundled", action="store_true",
                        help="regenerate pgmo/traces/*.json.gz")
    args = parser.parse_args(argv)
    if args.write_bundled:
        for path in write_bundled(Path(__file__).parent / "traces"):
            print(path)
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
