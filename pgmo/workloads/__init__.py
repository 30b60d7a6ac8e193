"""A family of variable workloads: whole runs made from a seed.

A pool that holds a repeating run at its physical limit may still hold far
more on a run whose iterations differ (the paper's showcase: seq2seq with
variable lengths).  Each member of :data:`FAMILY` writes, request by request
on the event clock, what a Chainer 7 program asks of CuPy's allocator on one
GPU (no cuDNN: Chainer's generic paths), as a :class:`~pgmo.runs.Run`:

* ``lstm-random``: an encoder-decoder LSTM, encoder and decoder lengths drawn 1..50;
* ``lstm-bucketed``: the same on sorted batches: lengths from a few buckets, so shapes recur;
* ``lstm-growing``: the same under a curriculum: the longest length grows over the run;
* ``lstm-outliers``: the same on short lengths with rare batches 3-4x as long;
* ``serving``: ResNet-50 inference, the batch size changing between bursts of requests;
* ``cnn-resolutions``: ResNet-50 training at several input resolutions;
* ``seq2seq-recorded``: the bundled recorded run (Chainer's seq2seq example, CPU capture).

Every generator is ``f(seed=0, *, iterations=..., scale=1.0, ...) -> Run``:
the same seed gives the same run; ``scale`` multiplies every request's
size (at least one byte), ``iterations`` sets the run's length.  Sizes are
the arrays' bytes as CuPy receives them (float32 data, int32 ids), not
rounded: pools round.  An array is freed when its last holder lets it go,
a holder being the program's variable or a function node that retains it
for backward (Chainer's ``retain_inputs`` / ``retain_outputs``) until the
graph is deleted after ``loss.backward()``; in
training, parameters' gradients live from the backward that makes them to
the next iteration's ``cleargrads()`` (after its forward), and the
optimizer's state is made by the first update.  The metadata say which
member, seed and parameters made the run, ``how`` in a line, and each
iteration's ``shapes`` (lengths, batch or resolution).

These are generated, not measured (``metadata["synthetic"]`` is True), and
each model condenses what the frameworks do where the full detail would
only multiply small requests: each docstring says where.

Core module: numpy only (its seeded ``Generator``), no CuPy, no Chainer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import numpy as np

from ..runs import Run, RunRecorder, read_run, write_run
from ..trace import Block, Trace

__all__ = ["FAMILY", "make", "names", "write", "lstm_random", "lstm_bucketed",
           "lstm_growing", "lstm_outliers", "serving", "cnn_resolutions", "seq2seq_recorded",
           "RECORDED_RUN"]

F32 = 4  # bytes of a float32
I32 = 4  # bytes of an int32 word id or label

#: The bundled recorded run behind ``seq2seq-recorded``.
RECORDED_RUN = (Path(__file__).parents[1] / "traces" / "runs"
                / "seq2seq-train-b64-30batches-cpu.run.json.gz")

_SYNTHETIC = {"synthetic": True}


class _Arrays:
    """A run's device arrays, each freed when its last holder lets it go.

    A function node's hold on what it retained for backward ends when the graph is
    deleted (:meth:`release` then :meth:`delete_graph`), not when its backward runs:
    Chainer's nodes keep their retained arrays until the last reference to the loss
    goes, after ``loss.backward()``.
    """

    def __init__(self, recorder: RunRecorder, scale: float) -> None:
        self.recorder = recorder
        self.scale = scale
        self.refs: dict[int, int] = {}
        self.graph: list[int] = []  # holds to end when the graph is deleted, in order

    def new(self, nbytes: int) -> int:
        """A new array of ``nbytes`` (times the scale), held once by the caller."""
        handle = self.recorder.alloc(max(1, math.ceil(nbytes * self.scale)))
        self.refs[handle] = 1
        return handle

    def temp(self, nbytes: int) -> None:
        """A temporary: made and freed at once."""
        self.drop(self.new(nbytes))

    def hold(self, *handles: int) -> None:
        for h in handles:
            self.refs[h] += 1

    def drop(self, *handles: int) -> None:
        for h in handles:
            left = self.refs[h] - 1
            if left:
                self.refs[h] = left
            else:
                del self.refs[h]
                self.recorder.free(h)

    def release(self, *handles: int) -> None:
        """A node's backward has run: its holds on ``handles`` end with the graph."""
        self.graph.extend(handles)

    def delete_graph(self) -> None:
        """The loss's last reference goes: every node's holds end, in the order their
        backward ran (the graph is torn down from the loss)."""
        graph, self.graph = self.graph, []
        self.drop(*graph)


class _Params:
    """A model's parameters: weights, their gradients (remade each iteration) and optimizer
    state (made by the first update)."""

    def __init__(self, arrays: _Arrays, sizes: Sequence[int], state_per_param: int) -> None:
        self.arrays = arrays
        self.sizes = list(sizes)  # bytes
        self.state_per_param = state_per_param
        self.weights: list[int] = []
        self.grads: dict[int, int] = {}  # param index -> its gradient's handle
        self.state: list[int] = []

    def make(self) -> None:
        self.weights = [self.arrays.new(n) for n in self.sizes]

    def cleargrads(self) -> None:
        """Chainer's ``cleargrads()``: every gradient dropped (after the forward pass)."""
        for h in self.grads.values():
            self.arrays.drop(h)
        self.grads = {}

    def grad(self, index: int) -> None:
        """The backward pass reaches parameter ``index``: its gradient is made the first
        time; later contributions are added into it (in place here)."""
        if index not in self.grads:
            self.grads[index] = self.arrays.new(self.sizes[index])

    def update(self) -> None:
        """The optimizer's update: its state made the first time (Adam: m and v; momentum
        SGD: v), each the size of its parameter; the update kernels allocate nothing."""
        if not self.state:
            self.state = [self.arrays.new(n) for n in self.sizes
                          for _ in range(self.state_per_param)]


def _finish(recorder: RunRecorder, workload: str, seed: int, how: str,
            parameters: dict[str, Any], shapes: list, **extra: Any) -> Run:
    return recorder.run(**_SYNTHETIC, workload=workload, seed=seed, how=how,
                        parameters=parameters, shapes=shapes, **extra,
                        recorded_by=f"pgmo.workloads ({workload}): generated, not a measurement")


def _pair(values: Any) -> tuple[int, int]:
    """An encoder and a decoder length, as ints."""
    return int(values[0]), int(values[1])


def _check(iterations: int, scale: float) -> None:
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
    if not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"scale must be a number > 0, got {scale!r}")


# ----------------------------------------------------------------- seq2seq LSTM
@dataclass(frozen=True)
class _Step:
    """One LSTM step of one layer, as its forward left it for backward."""

    layer: int
    t: int
    x: int
    h_prev: int
    c_prev: int
    stacked: int | None
    gates: int
    c: int
    h: int


class _Seq2seq:
    """Chainer's seq2seq example (an NStepLSTM encoder and decoder) on the generic path."""

    def __init__(self, arrays: _Arrays, *, batch: int, units: int, layers: int, vocab: int,
                 stacked_weights: bool, output: str) -> None:
        if output not in ("concat", "per-step"):
            raise ValueError(f"output must be 'concat' or 'per-step', got {output!r}")
        self.d = arrays
        self.B, self.H, self.L, self.V = batch, units, layers, vocab
        self.stacked_weights = stacked_weights
        self.output = output
        B, H, L, V = batch, units, layers, vocab
        # embed_x, embed_y; per layer of the encoder then of the decoder: the x-weights of
        # the four gates, the h-weights, the eight biases (Chainer: 8 + 8 arrays); W, b.
        sizes = [V * H * F32, V * H * F32]
        for _ in range(2 * L):
            sizes += [4 * H * H * F32, 4 * H * H * F32, 8 * H * F32]
        sizes += [V * H * F32, V * F32]
        self.params = _Params(arrays, sizes, state_per_param=2)  # Adam: m and v
        self.EMBED_X, self.EMBED_Y, self.OUT_W, self.OUT_B = 0, 1, len(sizes) - 2, len(sizes) - 1

    def layer_params(self, decoder: bool, layer: int) -> list[int]:
        first = 2 + 3 * (layer + (self.L if decoder else 0))
        return [first, first + 1, first + 2]

    def iteration(self, first: bool, src_len: int, tgt_len: int) -> None:
        d, p = self.d, self.params
        B, H, L = self.B, self.H, self.L
        if first:
            p.make()
        # The converter: each side's sentences in one device array (views per sentence);
        # the decoder's input and output ids with EOS (per sentence in the example).
        src = d.new(B * src_len * I32)
        tgt = d.new(B * tgt_len * I32)
        ys_in = d.new(B * tgt_len * I32)
        ys_out = d.new(B * tgt_len * I32)
        # forward
        src_ids, exs = self.embed_forward(src_len)
        enc, enc_tops, hy, cy = self.lstm_forward(exs, None, None)
        d.drop(*exs)
        d.temp(B * src_len * H * F32)  # the encoder's ys, transposed back and discarded
        d.drop(*enc_tops)
        tgt_ids, eys = self.embed_forward(tgt_len)
        dec, tops, dhy, dcy = self.lstm_forward(eys, hy, cy)
        d.drop(*eys, hy, cy, dhy, dcy)  # the decoder's final states are discarded
        out = self.output_forward(tops, tgt_len)
        # backward: the last iteration's gradients go now (cleargrads), then loss.backward()
        p.cleargrads()
        g_tops = self.output_backward(out, tgt_len)
        g_eys, g_hx, g_cx = self.lstm_backward(dec, g_tops, None, None, decoder=True)
        self.embed_backward(tgt_ids, g_eys, self.EMBED_Y)
        g_exs, g_h0, g_c0 = self.lstm_backward(enc, {}, g_hx, g_cx, decoder=False)
        d.drop(g_h0, g_c0)  # the encoder's zero states need no gradient further
        self.embed_backward(src_ids, g_exs, self.EMBED_X)
        d.delete_graph()  # del loss: what the nodes retained goes now
        d.drop(out["loss"])
        p.update()
        d.drop(src, tgt, ys_in, ys_out)

    def embed_forward(self, steps: int) -> tuple[int, list[int]]:
        """``sequence_embed``: the ids concatenated, embedded (EmbedID retains the ids), then
        NStepLSTM's ``transpose_sequence``: one (B, H) array per step."""
        d = self.d
        ids = d.new(self.B * steps * I32)
        embedded = d.new(self.B * steps * self.H * F32)
        xs = [d.new(self.B * self.H * F32) for _ in range(steps)]
        d.drop(embedded)
        return ids, xs

    def embed_backward(self, ids: int, g_xs: list[int], param: int) -> None:
        d = self.d
        g_embedded = d.new(self.B * len(g_xs) * self.H * F32)  # transpose_sequence backward
        d.drop(*g_xs)
        self.params.grad(param)
        d.drop(g_embedded)
        d.release(ids)

    def lstm_forward(self, xs: list[int], hx: int | None, cx: int | None):
        """NStepLSTM's generic path (``n_step_rnn_impl``): layer by layer, step by step,
        ``lstm(c, linear(x, Wx) + linear(h, Wh))``.

        Per step and layer: the two linear outputs (one (B, 8H) block here), freed once
        their sum, the gates (B, 4H), is made; the gates, the previous c, x and h are
        retained for backward, c too (``retain_outputs``); h lives while the next step or
        layer holds it.  With ``stacked_weights`` also the per-step copy of the stacked
        weights (``_stack_weight``: 4H x 2H floats), retained by ``linear``.  Returns the
        steps for backward, the top layer's outputs (held by the caller), and the final
        states stacked (``hy``, ``cy``, (L, B, H) each).
        """
        d = self.d
        B, H, L = self.B, self.H, self.L
        own_init = hx is None or cx is None
        if hx is None or cx is None:  # zeros made by the link, one (L, B, H) array each
            hx, cx = d.new(L * B * H * F32), d.new(L * B * H * F32)
        steps: list[_Step] = []
        inputs = xs
        last_h, last_c = [], []
        for layer in range(L):
            h_prev, c_prev = hx, cx
            outs = []
            for t, x in enumerate(inputs):
                stacked = d.new(4 * H * 2 * H * F32) if self.stacked_weights else None
                both = d.new(2 * B * 4 * H * F32)  # linear(x, Wx) and linear(h, Wh)
                d.hold(x, h_prev)  # retained by linear
                gates = d.new(B * 4 * H * F32)  # the sum: retained by lstm
                d.drop(both)
                d.hold(c_prev)  # retained by lstm
                c = d.new(B * H * F32)
                d.hold(c)  # lstm retains its c output
                h = d.new(B * H * F32)
                if t:
                    d.drop(c_prev)  # the loop's own reference to the last c
                steps.append(_Step(layer, t, x, h_prev, c_prev, stacked, gates, c, h))
                outs.append(h)
                h_prev, c_prev = h, c
            last_h.append(h_prev)
            last_c.append(c_prev)
            if layer:
                d.drop(*inputs)  # the layer below's outputs: h_list goes
            inputs = outs
        hy, cy = d.new(L * B * H * F32), d.new(L * B * H * F32)  # F.stack
        d.drop(*last_c)
        if own_init:
            d.drop(hx, cx)  # views of them are retained by each layer's first step
        return steps, inputs, hy, cy

    def lstm_backward(self, steps: list[_Step], g_tops: dict[int, int], g_hy: int | None,
                      g_cy: int | None, *, decoder: bool):
        """Backward through ``steps`` in reverse order of creation.

        Per step and layer: lstm's gradients of the gates (B, 4H) and of the previous c
        (one (B, 5H) block here, living as long as the latter), linear's of x and of the
        previous h, the layer's parameter gradients made at its first step back (later
        steps add in place); with ``stacked_weights`` a gradient of the stacked weights
        (4H x 2H) too, freed once added.  The gradients reaching one h from the next step
        and the layer above are added in place here (Chainer: into a new array).  Each
        gradient is freed once the step that takes it has run back; what forward retained
        stays until the graph is deleted.
        Returns the gradients of the inputs (per step) and of the initial states (stacked).
        """
        d, p = self.d, self.params
        B, H, L = self.B, self.H, self.L
        gh: dict[int, list[int]] = defaultdict(list)
        gc: dict[int, list[int]] = defaultdict(list)
        for t, g in g_tops.items():
            gh[steps[-len(g_tops) + t].h].append(g)
        last = {s.layer: s for s in steps}  # each layer's last step
        for layer, s in last.items():
            for grads, g_state in ((gh, g_hy), (gc, g_cy)):
                if g_state is not None:
                    d.hold(g_state)  # a view of the stacked gradient per layer
                    grads[s.h if grads is gh else s.c].append(g_state)
        if g_hy is not None and g_cy is not None:  # given together, or not at all
            d.drop(g_hy, g_cy)
        g_xs: dict[int, int] = {}
        g_init_h, g_init_c = [], []
        for s in reversed(steps):
            into_h, into_c = gh.pop(s.h, []), gc.pop(s.c, [])
            g_lstm = d.new(B * 5 * H * F32)  # the gates' gradient (B, 4H) and the last c's
            d.drop(*into_h, *into_c)
            d.release(s.gates, s.c_prev, s.c)
            g_x, g_h_prev = d.new(B * H * F32), d.new(B * H * F32)
            for index in self.layer_params(decoder, s.layer):
                p.grad(index)
            if s.stacked is not None:
                d.temp(4 * H * 2 * H * F32)
                d.release(s.stacked)
            d.release(s.x, s.h_prev)
            g_c_prev = g_lstm  # lives on as the last c's gradient
            if s.t:
                gh[s.h_prev].append(g_h_prev)
                gc[s.c_prev].append(g_c_prev)
            else:
                g_init_h.append(g_h_prev)
                g_init_c.append(g_c_prev)
            if s.layer:
                gh[s.x].append(g_x)
            else:
                g_xs[s.t] = g_x
        g_hx, g_cx = d.new(L * B * H * F32), d.new(L * B * H * F32)  # separate's backward
        d.drop(*g_init_h, *g_init_c)
        return [g_xs[t] for t in sorted(g_xs)], g_hx, g_cx

    def output_forward(self, tops: list[int], steps: int) -> dict:
        """The output layer and the loss over the vocabulary.

        ``concat`` (the example): the decoder's outputs transposed back per sentence
        (one block here) and concatenated, one linear to (B * steps, V) logits, softmax
        cross-entropy (``reduce='no'``: it retains the logits and the targets and caches
        its log-softmax), summed and divided by the batch.  ``per-step``: per decoder step,
        (B, V) logits and the cache, a loss added up step by step.
        """
        d = self.d
        B, H, V = self.B, self.H, self.V
        targets = d.new(B * steps * I32)  # F.concat(ys_out), retained by the loss
        if self.output == "concat":
            per_sentence = d.new(B * steps * H * F32)
            d.drop(*tops)
            os = d.new(B * steps * H * F32)  # retained by linear
            d.drop(per_sentence)
            logits = d.new(B * steps * V * F32)  # retained by the loss
            cache = d.new(B * steps * V * F32)
            losses = d.new(B * steps * F32)
            total = d.new(F32)
            d.drop(losses)
            loss = d.new(F32)
            d.drop(total)
            return {"targets": targets, "os": os, "logits": logits, "cache": cache, "loss": loss}
        step_logits: list[int] = []
        caches: list[int] = []
        running: int | None = None
        for h in tops:
            d.hold(h)  # retained by linear
            step_logits.append(d.new(B * V * F32))
            caches.append(d.new(B * V * F32))
            step_loss = d.new(F32)
            if running is None:
                running = step_loss
            else:
                new = d.new(F32)
                d.drop(running, step_loss)
                running = new
        d.drop(*tops)
        return {"targets": targets, "tops": tops, "logits": step_logits, "cache": caches,
                "loss": running}

    def output_backward(self, out: dict, steps: int) -> dict[int, int]:
        """The loss's gradient back to each decoder step's top output: {step: gradient}."""
        d, p = self.d, self.params
        B, H, V = self.B, self.H, self.V
        g_loss = d.new(F32)  # loss.backward(): ones
        if self.output == "concat":
            g_sum = d.new(F32)
            d.drop(g_loss)
            g_logits = d.new(B * steps * V * F32)
            d.drop(g_sum)
            d.release(out["cache"], out["logits"], out["targets"])
            g_os = d.new(B * steps * H * F32)
            p.grad(self.OUT_W)
            p.grad(self.OUT_B)
            d.drop(g_logits)
            d.release(out["os"])
            g_tops = {t: d.new(B * H * F32) for t in range(steps)}  # transpose_sequence back
            d.drop(g_os)
            return g_tops
        g_tops = {}
        for t in reversed(range(steps)):
            g_logits = d.new(B * V * F32)
            d.release(out["cache"][t], out["logits"][t])
            g_tops[t] = d.new(B * H * F32)
            p.grad(self.OUT_W)
            p.grad(self.OUT_B)
            d.drop(g_logits)
            d.release(out["tops"][t])
        d.drop(g_loss)
        d.release(out["targets"])
        return g_tops


def _lstm_run(workload: str, how: str, seed: int, lengths: list[tuple[int, int]],
              parameters: dict[str, Any], *, scale: float, batch: int, units: int,
              layers: int, vocab: int, stacked_weights: bool, output: str,
              **extra: Any) -> Run:
    recorder = RunRecorder()
    model = _Seq2seq(_Arrays(recorder, scale), batch=batch, units=units, layers=layers,
                     vocab=vocab, stacked_weights=stacked_weights, output=output)
    for k, (src_len, tgt_len) in enumerate(lengths):
        recorder.begin()
        model.iteration(k == 0, src_len, tgt_len)
        recorder.end()
    return _finish(recorder, workload, seed, how, parameters,
                   [[int(a), int(b)] for a, b in lengths], **extra)


_LSTM_DOC = """
    The model, as Chainer 7's seq2seq example runs it on the GPU without cuDNN (the
    generic NStepLSTM path), float32, Adam:

    * weights (embeddings V x H for each side, per LSTM layer the gates' x- and
      h-weights and their biases, the output layer H x V and V) made in the first
      iteration and kept; their gradients made by each backward pass and dropped by the
      next iteration's ``cleargrads()``; Adam's m and v per parameter made by the first
      update and kept;
    * per iteration the batch's ids (int32) on the device; the source embedded and
      transposed to one (B, H) array per step; per encoder step and layer the linear
      outputs (a temporary), the gates (B, 4H), c and h, retained for backward; the
      final states stacked for the decoder, which does the same per decoder step;
      the output layer over the vocabulary (see ``output``);
    * backward in reverse order of creation: the gradients of what forward kept, each
      freed once the function that takes it has run back; what the function nodes
      retained lives until the graph is deleted after ``loss.backward()`` (``del loss``),
      as in the project's recordings of Chainer; then the update, then the batch goes.

    Condensed: per-sentence arrays of the example are one block per batch; gradients
    reaching one array from two places, and parameter gradients from later steps, are
    added in place (Chainer adds out of place: a new array each time); lstm's two
    gradients per step are one block; with ``stacked_weights`` each step also keeps the
    generic path's stacked copy of its weights (4H x 2H) and frees a gradient of it.
"""


def lstm_random(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                min_len: int = 1, max_len: int = 50, batch: int = 64, units: int = 512,
                layers: int = 3, vocab: int = 16000, stacked_weights: bool = False,
                output: str = "concat") -> Run:
    """Encoder-decoder LSTM training with random lengths: each iteration's encoder and
    decoder lengths drawn uniformly, independently, from ``min_len..max_len``.
    """
    _check(iterations, scale)
    if not 1 <= min_len <= max_len:
        raise ValueError(f"lengths need 1 <= min_len <= max_len, got {min_len}..{max_len}")
    rng = np.random.default_rng(seed)
    lengths = [_pair(rng.integers(min_len, max_len + 1, size=2)) for _ in range(iterations)]
    params = dict(iterations=iterations, scale=scale, min_len=min_len, max_len=max_len,
                  batch=batch, units=units, layers=layers, vocab=vocab,
                  stacked_weights=stacked_weights, output=output)
    return _lstm_run("lstm-random", f"seq2seq LSTM {layers}x{units}, batch {batch}, "
                     f"encoder and decoder lengths uniform {min_len}..{max_len}", seed,
                     lengths, params, scale=scale, batch=batch, units=units, layers=layers,
                     vocab=vocab, stacked_weights=stacked_weights, output=output)


def lstm_bucketed(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                  buckets: Sequence[int] = (10, 20, 30, 40, 50), batch: int = 64,
                  units: int = 512, layers: int = 3, vocab: int = 16000,
                  stacked_weights: bool = False, output: str = "concat") -> Run:
    """Encoder-decoder LSTM training on sorted batches: each batch holds sentences of one
    bucket, padded to its length, so encoder and decoder both run the bucket's length;
    each iteration's bucket drawn uniformly.  A shape recurs (about iterations / buckets
    times each).
    """
    _check(iterations, scale)
    if not buckets or min(buckets) < 1:
        raise ValueError(f"buckets must be lengths >= 1, got {buckets!r}")
    rng = np.random.default_rng(seed)
    choice = rng.integers(0, len(buckets), size=iterations)
    lengths = [(int(buckets[c]), int(buckets[c])) for c in choice]
    params = dict(iterations=iterations, scale=scale, buckets=list(buckets), batch=batch,
                  units=units, layers=layers, vocab=vocab, stacked_weights=stacked_weights,
                  output=output)
    return _lstm_run("lstm-bucketed", f"seq2seq LSTM {layers}x{units}, batch {batch}, "
                     f"sorted batches padded to buckets {list(buckets)}", seed, lengths,
                     params, scale=scale, batch=batch, units=units, layers=layers, vocab=vocab,
                     stacked_weights=stacked_weights, output=output)


def lstm_growing(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                 start: int = 5, stop: int = 50, batch: int = 64, units: int = 512,
                 layers: int = 3, vocab: int = 16000, stacked_weights: bool = False,
                 output: str = "concat") -> Run:
    """Encoder-decoder LSTM training under a curriculum: iteration k's longest length
    rises linearly from ``start`` (first iteration) to ``stop`` (last); its encoder and
    decoder lengths drawn uniformly from 1..that.
    """
    _check(iterations, scale)
    if not 1 <= start <= stop:
        raise ValueError(f"the curriculum needs 1 <= start <= stop, got {start}..{stop}")
    rng = np.random.default_rng(seed)
    lengths = []
    for k in range(iterations):
        longest = start + round((stop - start) * k / max(1, iterations - 1))
        lengths.append(_pair(rng.integers(1, longest + 1, size=2)))
    params = dict(iterations=iterations, scale=scale, start=start, stop=stop, batch=batch,
                  units=units, layers=layers, vocab=vocab, stacked_weights=stacked_weights,
                  output=output)
    return _lstm_run("lstm-growing", f"seq2seq LSTM {layers}x{units}, batch {batch}, "
                     f"curriculum: longest length {start} rising to {stop}", seed, lengths,
                     params, scale=scale, batch=batch, units=units, layers=layers, vocab=vocab,
                     stacked_weights=stacked_weights, output=output)


def lstm_outliers(seed: int = 0, *, iterations: int = 30, scale: float = 1.0,
                  short: tuple[int, int] = (5, 15), rate: float = 0.05,
                  factor: tuple[float, float] = (3.0, 4.0), batch: int = 64,
                  units: int = 512, layers: int = 3, vocab: int = 16000,
                  stacked_weights: bool = False, output: str = "concat") -> Run:
    """Encoder-decoder LSTM training on mostly short lengths (uniform in ``short``) with
    rare long outliers: ``max(1, round(rate * iterations))`` iterations, drawn among all
    but the first, have both lengths ``factor`` (drawn uniformly) times a short one.
    """
    _check(iterations, scale)
    low, high = short
    if not 1 <= low <= high:
        raise ValueError(f"short lengths need 1 <= low <= high, got {short!r}")
    if not 1 <= factor[0] <= factor[1]:
        raise ValueError(f"factor must be a range (low, high) with 1 <= low <= high, "
                         f"got {factor!r}")
    rng = np.random.default_rng(seed)
    lengths = [_pair(rng.integers(low, high + 1, size=2))
               for _ in range(iterations)]
    count = min(iterations - 1, max(1, round(rate * iterations)))
    outliers = sorted(int(k) for k in rng.choice(np.arange(1, iterations), size=count,
                                                 replace=False)) if count > 0 else []
    for k in outliers:
        lengths[k] = _pair([max(1, round(n * rng.uniform(*factor))) for n in lengths[k]])
    params = dict(iterations=iterations, scale=scale, short=list(short), rate=rate,
                  factor=list(factor), batch=batch, units=units, layers=layers, vocab=vocab,
                  stacked_weights=stacked_weights, output=output)
    return _lstm_run("lstm-outliers", f"seq2seq LSTM {layers}x{units}, batch {batch}, "
                     f"lengths {low}..{high} with {len(outliers)} outliers at "
                     f"{factor[0]:g}-{factor[1]:g}x", seed, lengths, params, scale=scale,
                     batch=batch, units=units, layers=layers, vocab=vocab,
                     stacked_weights=stacked_weights, output=output, outliers=outliers)


for _f in (lstm_random, lstm_bucketed, lstm_growing, lstm_outliers):
    if _f.__doc__:  # None under python -OO
        _f.__doc__ += _LSTM_DOC


# --------------------------------------------------------------------- ResNet
@dataclass(frozen=True)
class _ConvUnit:
    """Convolution (no bias), batch normalization, ReLU unless ``relu`` is False."""

    c_in: int
    c_out: int
    k: int
    stride: int
    pad: int
    relu: bool
    weight: int  # parameter indices: W, gamma, beta
    gamma: int
    beta: int


def _out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


class _ResNet:
    """ResNet-50 as the project's example builds it (``examples/models/resnet50.py``: the
    stride in a bottleneck's 3x3 convolution, a projection shortcut where the shape
    changes, max pooling 3x3/2 with padding 1, global average pooling).

    Its parameters are those of the recorded ``resnet50-train-b32-cpu`` run (the same
    long-lived bytes); at 224 px and batch 32 an iteration's own lower bound here is
    92% of that recording's (functions' inner arrays condensed: 64% of its requests).

    A convolution on the generic path (no cuDNN) makes its im2col buffer
    (B, C, k, k, oh, ow), multiplies it into its output and frees it; backward makes
    the buffer again for the weight gradient and a (B, C, k, k, oh, ow) gradient that
    col2im folds into the input's gradient.  Batch normalization in training keeps
    its input, the batch's mean and 1/std (C each); ReLU keeps its output.
    """

    def __init__(self, arrays: _Arrays, blocks: Sequence[int], classes: int,
                 state_per_param: int) -> None:
        self.d = arrays
        self.classes = classes
        sizes: list[int] = []
        persistent: list[int] = []

        def unit(c_in, c_out, k, stride, pad, relu=True):
            sizes.extend([c_out * c_in * k * k * F32, c_out * F32, c_out * F32])
            persistent.extend([c_out * F32, c_out * F32])  # running mean and variance
            n = len(sizes)
            return _ConvUnit(c_in, c_out, k, stride, pad, relu, n - 3, n - 2, n - 1)

        self.stem = unit(3, 64, 7, 2, 3)
        self.stages = []
        c_in = 64
        for n_blocks, mid, stride in zip(blocks, (64, 128, 256, 512), (1, 2, 2, 2)):
            out = 4 * mid
            stage = []
            for i in range(n_blocks):
                s = stride if i == 0 else 1
                branch = [unit(c_in, mid, 1, 1, 0), unit(mid, mid, 3, s, 1),
                          unit(mid, out, 1, 1, 0, relu=False)]
                shortcut = (unit(c_in, out, 1, s, 0, relu=False) if s != 1 or c_in != out
                            else None)
                stage.append((branch, shortcut))
                c_in = out
            self.stages.append(stage)
        self.features = c_in
        sizes.extend([classes * c_in * F32, classes * F32])
        self.fc_w, self.fc_b = len(sizes) - 2, len(sizes) - 1
        self.params = _Params(arrays, sizes, state_per_param)
        self.persistent_sizes = persistent
        self.persistent: list[int] = []

    def make(self) -> None:
        self.params.make()
        self.persistent = [self.d.new(n) for n in self.persistent_sizes]

    # Forward: each call takes the caller's reference to its input and returns a new one.
    def unit_forward(self, u: _ConvUnit, x: int, B: int, hw: int, train: bool):
        """(output, its side, the record backward needs or None in inference)."""
        d = self.d
        o = _out(hw, u.k, u.stride, u.pad)
        col = B * u.c_in * u.k * u.k * o * o * F32
        act = B * u.c_out * o * o * F32
        d.temp(col)
        y = d.new(act)  # retained by batch normalization in training
        if train:
            d.hold(x)  # retained by the convolution
            mean, inv_std = d.new(u.c_out * F32), d.new(u.c_out * F32)
        z = d.new(act)
        if not train:
            d.drop(y)
        if u.relu:
            r = d.new(act)
            d.drop(z)
            if train:
                d.hold(r)  # ReLU retains its output
            z = r
        record = (u, x, y, mean, inv_std, z if u.relu else None, col, hw, act) if train else None
        return z, o, record

    def unit_backward(self, record, g: int, B: int) -> int | None:
        """The gradient of a unit's input from that of its output (None for the images)."""
        d, p = self.d, self.params
        u, x, y, mean, inv_std, r, col, hw, act = record
        if r is not None:
            g_z = d.new(act)
            d.drop(g)
            d.release(r)
            g = g_z
        g_y = d.new(act)
        p.grad(u.gamma)
        p.grad(u.beta)
        d.drop(g)
        d.release(mean, inv_std, y)
        d.temp(col)  # im2col of x again, for the weight gradient
        p.grad(u.weight)
        d.release(x)
        if u is self.stem:  # the images need no gradient
            d.drop(g_y)
            return None
        d.temp(col)  # the gradient of the columns, folded by col2im
        g_x = d.new(B * u.c_in * hw * hw * F32)
        d.drop(g_y)
        return g_x

    def forward(self, x: int, B: int, res: int, train: bool, tape: list) -> int:
        """The logits (B, classes) from the images ``x`` (the caller's reference taken);
        in training, ``tape`` gets what backward needs, in order of creation."""
        d = self.d
        h, hw, record = self.unit_forward(self.stem, x, B, res, train)
        if train:
            tape.append(("unit", record))
        d.drop(x)
        o = (hw + 2 * 1 - 3 + 2 - 1) // 2 + 1  # max pooling 3x3/2, padding 1, cover_all
        c = self.stem.c_out
        pooled = d.new(B * c * o * o * F32)
        if train:
            indexes = d.new(B * c * o * o * I32)  # kept for backward
            tape.append(("maxpool", indexes, B * c * hw * hw * F32))
        d.drop(h)
        h, hw = pooled, o
        for stage in self.stages:
            for branch, shortcut in stage:
                records = []
                a = h
                d.hold(a)
                side = hw
                for u in branch:
                    b, side, record = self.unit_forward(u, a, B, side, train)
                    d.drop(a)
                    records.append(record)
                    a = b
                if shortcut is not None:
                    s, _, short_record = self.unit_forward(shortcut, h, B, hw, train)
                else:
                    s, short_record = h, None
                    d.hold(h)
                act = B * branch[2].c_out * side * side * F32
                added = d.new(act)
                d.drop(a, s)
                out = d.new(act)
                d.drop(added)
                if train:
                    d.hold(out)  # ReLU retains its output
                    tape.append(("block", records, short_record, out,
                                 B * branch[0].c_in * hw * hw * F32, act))
                d.drop(h)  # the block's input: the caller's reference
                h, hw = out, side
        pooled = d.new(B * self.features * F32)  # global average pooling
        if train:
            tape.append(("avgpool", B * self.features * hw * hw * F32))
        d.drop(h)
        logits = d.new(B * self.classes * F32)
        if train:
            d.hold(pooled)  # retained by linear
            tape.append(("fc", pooled))
        d.drop(pooled)
        return logits

    def backward(self, tape: list, g: int, B: int) -> None:
        """From the gradient of the pooled features back to the images, in reverse (only
        the first unit, on the images, gives no gradient: nothing comes after it)."""
        d = self.d
        for entry in reversed(tape):
            kind = entry[0]
            if kind == "unit":
                g = cast(int, self.unit_backward(entry[1], g, B))
            elif kind == "avgpool" or kind == "maxpool":
                g_in = d.new(entry[-1])
                d.drop(g)
                d.release(*entry[1:-1])  # max pooling's indexes
                g = g_in
            elif kind == "block":
                _, records, short_record, out, in_bytes, act = entry
                g_relu = d.new(act)
                d.drop(g)
                d.release(out)
                d.hold(g_relu)  # the sum passes it to both branches
                # the shortcut was made last: its backward runs first
                g_short = (cast(int, self.unit_backward(short_record, g_relu, B))
                           if short_record is not None else g_relu)
                g_branch = g_relu
                for record in reversed(records):
                    g_branch = cast(int, self.unit_backward(record, g_branch, B))
                g = d.new(in_bytes)  # the two gradients of the block's input, summed
                d.drop(g_branch, g_short)


def _resnet_iteration(model: _ResNet, first: bool, B: int, res: int) -> None:
    d, p = model.d, model.params
    if first:
        model.make()
    x = d.new(B * 3 * res * res * F32)  # the batch on the device
    labels = d.new(B * I32)
    tape: list = []
    logits = model.forward(x, B, res, True, tape)
    cache = d.new(B * model.classes * F32)  # softmax cross-entropy's log-softmax
    loss = d.new(F32)
    p.cleargrads()
    g_loss = d.new(F32)
    g_logits = d.new(B * model.classes * F32)
    d.drop(g_loss)
    d.release(cache, logits)
    g = d.new(B * model.features * F32)
    p.grad(model.fc_w)
    p.grad(model.fc_b)
    d.drop(g_logits)
    d.release(tape.pop()[1])  # the pooled features, retained by linear
    model.backward(tape, g, B)
    d.delete_graph()  # del loss: what the nodes retained goes now
    d.drop(loss)
    p.update()
    d.drop(labels)


def serving(seed: int = 0, *, iterations: int = 150, scale: float = 1.0,
            batches: Sequence[int] = (1, 4, 8, 16, 32), burst: tuple[int, int] = (5, 20),
            resolution: int = 224, blocks: Sequence[int] = (3, 4, 6, 3),
            classes: int = 1000) -> Run:
    """Inference serving: ResNet-50 (float32, no cuDNN) answering requests in bursts, one
    iteration per request, the batch size changing between bursts.

    The model's weights and batch normalization's running statistics are loaded once,
    before the first request (outside every iteration).  Per request: the batch of
    images on the device; per convolution its im2col buffer (freed at once) and output;
    batch normalization's and ReLU's outputs, each array freed as soon as the next layer
    has used it (no backward: nothing retained), a block's input kept until its residual
    sum; the logits and their softmax, copied back and freed.  Bursts last
    ``burst`` requests (drawn uniformly); each burst's batch size is drawn from
    ``batches`` other than the last one's.
    """
    _check(iterations, scale)
    if not batches or min(batches) < 1:
        raise ValueError(f"batches must be sizes >= 1, got {batches!r}")
    if not 1 <= burst[0] <= burst[1]:
        raise ValueError(f"burst must be a range (low, high) with 1 <= low <= high, "
                         f"got {burst!r}")
    rng = np.random.default_rng(seed)
    recorder = RunRecorder()
    d = _Arrays(recorder, scale)
    model = _ResNet(d, blocks, classes, state_per_param=0)
    model.make()
    shapes: list[int] = []
    batch, left = 0, 0  # no batch yet: 0 is none of the batch sizes
    for _ in range(iterations):
        if not left:
            others = [b for b in batches if b != batch] or list(batches)
            batch = int(others[int(rng.integers(len(others)))])
            left = int(rng.integers(burst[0], burst[1] + 1))
        left -= 1
        recorder.begin()
        x = d.new(batch * 3 * resolution * resolution * F32)
        logits = model.forward(x, batch, resolution, False, [])
        probabilities = d.new(batch * classes * F32)
        d.drop(logits, probabilities)
        recorder.end()
        shapes.append(batch)
    params = dict(iterations=iterations, scale=scale, batches=list(batches), burst=list(burst),
                  resolution=resolution, blocks=list(blocks), classes=classes)
    return _finish(recorder, "serving", seed,
                   f"ResNet inference at {resolution}px, bursts of {burst[0]}-{burst[1]} "
                   f"requests at batch sizes {list(batches)}", params, shapes)


def cnn_resolutions(seed: int = 0, *, iterations: int = 40, scale: float = 1.0,
                    resolutions: Sequence[int] = (160, 192, 224, 256), phase: int = 1,
                    batch: int = 32, blocks: Sequence[int] = (3, 4, 6, 3),
                    classes: int = 1000) -> Run:
    """CNN training at several input resolutions: ResNet-50 (float32, no cuDNN, momentum
    SGD), each phase of ``phase`` iterations at a resolution drawn uniformly from
    ``resolutions`` (1: a new draw every iteration, as multi-scale training does; more:
    phases, as progressive resizing does).

    Weights and running statistics made in the first iteration; per iteration the images
    and labels on the device; forward retains each convolution's input, batch
    normalization's input, mean and 1/std, ReLU's output, max pooling's indexes, frees
    im2col buffers and the rest at once; softmax cross-entropy over the classes; backward
    in reverse, each unit's gradients (ReLU, batch normalization, the weight gradient with
    its own im2col buffer, the columns' gradient folded into the input's), a block's two
    input gradients summed, each freed once used, parameter gradients kept until the
    next ``cleargrads()``; what forward retained goes when the graph is deleted after
    backward (so an iteration peaks at the end of its backward pass, as the project's
    recording of ResNet-50 does); the momentum made by the first update.
    """
    _check(iterations, scale)
    if not resolutions or min(resolutions) < 64:
        raise ValueError(f"resolutions must be sides >= 64 pixels, got {resolutions!r}")
    if isinstance(phase, bool) or not isinstance(phase, int) or phase < 1:
        raise ValueError(f"phase must be an integer >= 1, got {phase!r}")
    rng = np.random.default_rng(seed)
    recorder = RunRecorder()
    model = _ResNet(_Arrays(recorder, scale), blocks, classes, state_per_param=1)
    shapes: list[int] = []
    for k in range(iterations):
        if k % phase == 0:
            res = int(resolutions[int(rng.integers(len(resolutions)))])
        recorder.begin()
        _resnet_iteration(model, k == 0, batch, res)
        recorder.end()
        shapes.append(res)
    params = dict(iterations=iterations, scale=scale, resolutions=list(resolutions),
                  phase=phase, batch=batch, blocks=list(blocks), classes=classes)
    return _finish(recorder, "cnn-resolutions", seed,
                   f"ResNet training, batch {batch}, resolutions {list(resolutions)} "
                   f"drawn every {phase} iteration(s)", params, shapes)


# ---------------------------------------------------------------- recorded run
_recorded_cache: dict[str, Run] = {}


def _recorded() -> Run:
    key = str(RECORDED_RUN)
    if key not in _recorded_cache:
        _recorded_cache[key] = read_run(RECORDED_RUN)
    return _recorded_cache[key]


def seq2seq_recorded(seed: int = 0, *, iterations: int = 30, scale: float = 1.0) -> Run:
    """The bundled recorded run: Chainer's seq2seq example (3 x 512 LSTM, batch 64,
    vocabulary 40,000, sentences of 1-50 words, Adam) for 30 batches, its arrays'
    allocations captured on the CPU (see its metadata's ``recorded_by`` and ``note``).

    ``seed`` is ignored: the run is what was recorded.  ``iterations`` keeps the first
    ones (at most 30): requests after the last kept iteration are dropped and blocks
    freed after it stay open.  ``scale`` multiplies every size (at least one byte).
    Unlike the generated members it has about 12,500 requests per iteration (375,000 in
    all): the generic path's every array, per-sentence arrays and stacked weights
    included.
    """
    _check(iterations, scale)
    run = _recorded()
    if iterations > len(run.iterations):
        raise ValueError(f"{RECORDED_RUN.name} has {len(run.iterations)} iterations; "
                         f"asked for {iterations}")
    blocks = run.trace.blocks
    kept = list(run.iterations[:iterations])
    if iterations < len(run.iterations) or scale != 1.0:
        cut = kept[-1][1] if iterations < len(run.iterations) else None
        out = []
        for b in blocks:
            if cut is not None and b.lower >= cut:
                continue
            upper = b.upper if cut is None or (b.upper is not None and b.upper <= cut) else None
            size = b.size if scale == 1.0 else max(1, math.ceil(b.size * scale))
            out.append(Block(b.id, b.lower, upper, size))
        blocks = tuple(out)
    meta = {k: v for k, v in run.metadata.items() if k != "iterations"}
    meta.update(workload="seq2seq-recorded", seed=seed,
                how="Chainer's seq2seq example, 3x512 LSTM, batch 64, recorded on the CPU",
                parameters=dict(iterations=iterations, scale=scale), shapes=None,
                iterations=[list(it) for it in kept])
    return Run(Trace(blocks, meta), tuple(kept))


# -------------------------------------------------------------------- registry
#: The family, in order: name -> generator ``f(seed=0, *, iterations, scale, ...) -> Run``.
FAMILY: dict[str, Callable[..., Run]] = {
    "lstm-random": lstm_random,
    "lstm-bucketed": lstm_bucketed,
    "lstm-growing": lstm_growing,
    "lstm-outliers": lstm_outliers,
    "serving": serving,
    "cnn-resolutions": cnn_resolutions,
    "seq2seq-recorded": seq2seq_recorded,
}


def names() -> list[str]:
    """The members' names, in order."""
    return list(FAMILY)


def make(name: str, seed: int = 0, **options: Any) -> Run:
    """The run of member ``name`` for ``seed`` (``options``: its keywords)."""
    try:
        generator = FAMILY[name]
    except KeyError:
        raise ValueError(f"no workload {name!r}; the family is {', '.join(FAMILY)}") from None
    return generator(seed, **options)


def write(name: str, path: str | Path, seed: int = 0, **options: Any) -> Run:
    """Write member ``name``'s run for ``seed`` to a run file (``.run.json.gz``) for
    inspection with any reader of pgmo traces; returns the run."""
    run = make(name, seed, **options)
    write_run(run, path)
    return run
