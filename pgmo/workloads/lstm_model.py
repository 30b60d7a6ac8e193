"""The seq2seq LSTM the ``lstm-*`` workloads run: Chainer's example, request by request.

Kept apart from the generators (:mod:`.lstm`), which only choose each
iteration's lengths: this is the model of what one iteration asks of the
allocator.  Tested through the generators, in ``tests/test_workloads.py``.

Core module: no CuPy, no Chainer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .arrays import F32, I32, Arrays, Params


@dataclass(frozen=True)
class Step:
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


@dataclass(frozen=True)
class LstmModel:
    """The model every ``lstm-*`` member trains (each generator's keywords of the same
    names): ``batch`` sentences per iteration, ``layers`` LSTM layers of ``units`` each in
    the encoder and in the decoder, a vocabulary of ``vocab`` words; ``stacked_weights``:
    each step also copies its weights (the generic path's ``_stack_weight``);
    ``output``: the loss over the decoder's outputs at once (``"concat"``, the example's)
    or step by step (``"per-step"``)."""

    batch: int = 64
    units: int = 512
    layers: int = 3
    vocab: int = 16000
    stacked_weights: bool = False
    output: str = "concat"

    def how(self) -> str:
        """The model in the words that start a run's ``how``."""
        return f"seq2seq LSTM {self.layers}x{self.units}, batch {self.batch}"


class Seq2seq:
    """Chainer's seq2seq example (an NStepLSTM encoder and decoder) on the generic path."""

    def __init__(self, arrays: Arrays, model: LstmModel) -> None:
        if model.output not in ("concat", "per-step"):
            raise ValueError(f"output must be 'concat' or 'per-step', got {model.output!r}")
        batch, units, layers, vocab = model.batch, model.units, model.layers, model.vocab
        self.d = arrays
        self.B, self.H, self.L, self.V = batch, units, layers, vocab
        self.stacked_weights = model.stacked_weights
        self.output = model.output
        B, H, L, V = batch, units, layers, vocab
        # embed_x, embed_y; per layer of the encoder then of the decoder: the x-weights of
        # the four gates, the h-weights, the eight biases (Chainer: 8 + 8 arrays); W, b.
        sizes = [V * H * F32, V * H * F32]
        for _ in range(2 * L):
            sizes += [4 * H * H * F32, 4 * H * H * F32, 8 * H * F32]
        sizes += [V * H * F32, V * F32]
        self.params = Params(arrays, sizes, state_per_param=2)  # Adam: m and v
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
        steps: list[Step] = []
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
                steps.append(Step(layer, t, x, h_prev, c_prev, stacked, gates, c, h))
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

    def lstm_backward(self, steps: list[Step], g_tops: dict[int, int], g_hy: int | None,
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
