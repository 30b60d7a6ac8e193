#!/usr/bin/env python
"""The paper's variable-length experiment: an NStepLSTM encoder-decoder.

Sentence pairs are synthetic: source lengths are drawn from 1-50 words of a
``--vocab``-word vocabulary, and the target is the reversed source with every
word renamed by a fixed permutation (so the loss can go down).  Every batch
has other lengths, so the allocation sequence changes from iteration to
iteration: pgmo serves the unplanned requests from its fallback pool and
re-optimizes, and the counts are printed as training goes.  Then greedy
inference generates up to 100 words per sentence, as in the paper::

    python examples/seq2seq.py --pool stock pgmo --device 0
    python examples/seq2seq.py --device -1 --vocab 50 --units 16 --layers 1 \\
        --batchsize 4 --iterations 2 --translate 2          # CPU smoke run
"""

import contextlib
import logging
import os
import sys
import tempfile

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pgmo.chainer  # noqa: E402  (applies the Chainer compatibility layer first)

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import numpy as np  # noqa: E402
from chainer import training  # noqa: E402
from chainer.training import extensions  # noqa: E402

from measure import (  # noqa: E402
    NA, add_pgmo_options, make_pool, mib, pgmo_options, print_table, Recorder,
    add_device_option, pick_device, release_cached, report_stream, require_positive,
    use_device,
)

UNK, EOS = 0, 1  # word ids 0 and 1 are reserved; real words are 2 .. vocab-1


def synthetic_pairs(count, vocab, min_length, max_length, seed):
    """``count`` (source, target) int32 pairs; target = renamed, reversed source."""
    rng = np.random.default_rng(seed)
    rename = np.concatenate([[UNK, EOS], 2 + rng.permutation(vocab - 2)]).astype(np.int32)
    pairs = []
    for _ in range(count):
        source = rng.integers(2, vocab, rng.integers(min_length, max_length + 1)).astype(np.int32)
        pairs.append((source, rename[source[::-1]]))
    return pairs


def send_sequences(device, sequences):
    """Move a list of 1-D arrays to ``device`` with one copy, as views of one array."""
    flat = device.send(np.concatenate(sequences))
    return device.xp.split(flat, np.cumsum([len(s) for s in sequences[:-1]]))


@chainer.dataset.converter()
def convert_pairs(batch, device):
    return {"sources": send_sequences(device, [s for s, _ in batch]),
            "targets": send_sequences(device, [t for _, t in batch])}


class Seq2seq(chainer.Chain):
    """Embeddings, an NStepLSTM encoder and decoder, and a softmax over the vocabulary."""

    def __init__(self, vocab, units, layers, dropout=0.1):
        super().__init__()
        with self.init_scope():
            self.embed_source = L.EmbedID(vocab, units)
            self.embed_target = L.EmbedID(vocab, units)
            self.encoder = L.NStepLSTM(layers, units, units, dropout)
            self.decoder = L.NStepLSTM(layers, units, units, dropout)
            self.output = L.Linear(units, vocab)

    @staticmethod
    def _embed(embed, sequences):
        """Embed all sequences in one call, then split them again."""
        xp = chainer.backend.get_array_module(sequences[0])
        vectors = embed(xp.concatenate(sequences))
        return F.split_axis(vectors, np.cumsum([len(s) for s in sequences[:-1]]), axis=0)

    def encode(self, sources):
        """Final LSTM states of the reversed sources (Sutskever et al., 2014)."""
        reversed_sources = [s[::-1] for s in sources]
        h, c, _ = self.encoder(None, None, self._embed(self.embed_source, reversed_sources))
        return h, c

    def forward(self, sources, targets):
        """Mean per-word cross entropy of predicting each target word and EOS."""
        xp = self.xp
        eos = xp.full(1, EOS, np.int32)
        decoder_inputs = [xp.concatenate([eos, t]) for t in targets]
        expected = xp.concatenate([xp.concatenate([t, eos]) for t in targets])
        h, c = self.encode(sources)
        _, _, outputs = self.decoder(h, c, self._embed(self.embed_target, decoder_inputs))
        loss = F.softmax_cross_entropy(self.output(F.concat(outputs, axis=0)), expected)
        chainer.report({"loss": loss, "perplexity": F.exp(loss)}, self)
        return loss

    def translate(self, sources, max_length=100):
        """Greedy decoding of up to ``max_length`` words; host lists without EOS."""
        xp = self.xp
        with chainer.no_backprop_mode(), chainer.using_config("train", False):
            h, c = self.encode(sources)
            words = xp.full(len(sources), EOS, np.int32)
            steps = []
            for _ in range(max_length):
                inputs = F.split_axis(self.embed_target(words), len(sources), axis=0)
                h, c, outputs = self.decoder(h, c, inputs)
                scores = self.output(F.concat(outputs, axis=0)).array
                words = scores.argmax(axis=1).astype(np.int32)
                steps.append(words)
                if bool((xp.stack(steps) == EOS).any(axis=0).all()):
                    break  # every sentence has ended
            generated = chainer.backends.cuda.to_cpu(xp.stack(steps, axis=1))
        return [row[:np.flatnonzero(row == EOS)[0]] if (row == EOS).any() else row
                for row in generated]


class IterationRecorder(training.Extension):
    """Sample time and memory after every update (printing is PrintReport's job)."""

    trigger = 1, "iteration"
    priority = training.PRIORITY_READER

    def __init__(self, recorder):
        self.recorder = recorder

    def initialize(self, trainer):
        self.recorder.start()

    def __call__(self, trainer):
        self.recorder.record()


def train(args, pool_name, device, model, pairs):
    """Train with Chainer's Trainer; pgmo's counts appear in PrintReport's columns."""
    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)
    iterator = chainer.iterators.SerialIterator(pairs, args.batchsize, shuffle=True)
    updater = training.updaters.StandardUpdater(iterator, optimizer, converter=convert_pairs,
                                                device=device)
    pool = make_pool(args.device, **pgmo_options(args)) if pool_name == "pgmo" else None
    recorder = Recorder(args.device, pool)
    entries = ["iteration", "main/loss", "main/perplexity"]
    if pool is not None and args.device >= 0:
        entries += ["pgmo/reoptimizations", "pgmo/departed_requests", "pgmo/arena_bytes"]
    entries.append("elapsed_time")
    with tempfile.TemporaryDirectory() as out:
        trainer = training.Trainer(updater, (args.iterations, "iteration"), out=out)
        if pool is not None:
            trainer.extend(pgmo.chainer.ProfileGuidedMemory(pool))
        trainer.extend(IterationRecorder(recorder))
        trainer.extend(extensions.LogReport(trigger=(args.log_interval, "iteration")))
        trainer.extend(extensions.PrintReport(entries, out=report_stream()),
                       trigger=(args.log_interval, "iteration"))
        trainer.run()
    return summary_row("train", pool_name, args.batchsize, recorder)


def translate(args, pool_name, device, model, pairs):
    """Greedy inference of ``args.translate`` sentences, one pgmo iteration per batch."""
    pool = make_pool(args.device, **pgmo_options(args)) if pool_name == "pgmo" else None
    recorder = Recorder(args.device, pool)
    sources = [s for s, _ in pairs[:args.translate]]
    with pool if pool is not None else contextlib.nullcontext():
        recorder.start()
        for first in range(0, len(sources), args.translate_batch):
            batch = sources[first:first + args.translate_batch]
            with pool.iteration() if pool is not None else contextlib.nullcontext():
                outputs = model.translate(send_sequences(device, batch), args.max_output)
            seconds, held, _ = recorder.record()
            counts = ""
            if pool is not None and args.device >= 0:
                stats = pool.stats()
                counts = (f"reoptimizations {stats.reoptimizations:3d}  "
                          f"departed requests {stats.departed_requests:6d}  ")
            span = f"{first + 1}" + (f"-{first + len(batch)}" if len(batch) > 1 else "")
            words_in = ",".join(str(len(s)) for s in batch)
            words_out = ",".join(str(len(o)) for o in outputs)
            print(f"  sentence {span:>9s}  words in {words_in:>12s}  out {words_out:>12s}  "
                  f"{counts}pools {mib(held):>14s}  {1e3 * seconds:8.1f} ms", flush=True)
    return summary_row("inference", pool_name, args.translate_batch, recorder)


SUMMARY_COLUMNS = ("task", "pool", "batch", "iters", "reoptimizations", "departed reqs",
                   "peak pool bytes", "peak device in use", "ms/iter")


def summary_row(task, pool_name, batch, recorder):
    pool = recorder.pool
    stats = pool.stats() if pool is not None and recorder.device_id >= 0 else None
    return (task, pool_name, batch, recorder.iterations,
            stats.reoptimizations if stats else ("-" if pool is None else NA),
            stats.departed_requests if stats else ("-" if pool is None else NA),
            recorder.peak_text(recorder.peak_pool), recorder.peak_text(recorder.peak_device),
            f"{recorder.watch.steady_ms():.1f}")


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", nargs="+", choices=("stock", "pgmo"), default=["pgmo"])
    parser.add_argument("--vocab", type=int, default=40000, help="vocabulary size")
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batchsize", "-b", type=int, default=64)
    parser.add_argument("--iterations", "-i", type=int, default=100)
    parser.add_argument("--sentences", type=int, default=10000, help="synthetic training pairs")
    parser.add_argument("--min-length", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=50)
    parser.add_argument("--translate", type=int, default=20, help="sentences to translate")
    parser.add_argument("--translate-batch", type=int, default=1)
    parser.add_argument("--max-output", type=int, default=100, help="words generated at most")
    parser.add_argument("--log-interval", type=int, default=1,
                        help="iterations per printed line (LogReport averages over them)")
    add_device_option(parser)
    add_pgmo_options(parser)
    parser.add_argument("--seed", type=int, default=0, help="seeds the data and the weights")
    args = parser.parse_args(argv)
    require_positive(parser, args, ("units", "layers", "batchsize", "iterations", "sentences",
                                    "min_length", "translate_batch", "max_output",
                                    "log_interval"))
    if args.vocab < 3:
        parser.error(f"--vocab must be at least 3 (two ids are reserved), got {args.vocab}")
    if args.max_length < args.min_length:
        parser.error(f"--max-length {args.max_length} is below --min-length {args.min_length}")
    if args.translate < 0:
        parser.error(f"--translate must not be negative, got {args.translate}")
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    pick_device(args)
    device = use_device(args.device, "On the CPU Chainer allocates with NumPy, not CuPy: pgmo "
                                      "receives no requests, so its counts and the memory "
                                      f"columns read {NA}.")
    pairs = synthetic_pairs(args.sentences, args.vocab, args.min_length, args.max_length,
                            args.seed)
    rows = []
    for pool_name in args.pool:
        np.random.seed(args.seed)  # Chainer's initializers draw from NumPy: same weights per pool
        model = Seq2seq(args.vocab, args.units, args.layers)
        model.to_device(device)
        print(f"\ntraining, pool {pool_name}: {args.layers} x {args.units} LSTM, vocabulary "
              f"{args.vocab}, sentences of {args.min_length}-{args.max_length} words", flush=True)
        rows.append(train(args, pool_name, device, model, pairs))
        if args.translate:
            print(f"\ninference, pool {pool_name}: up to {args.max_output} words per sentence",
                  flush=True)
            rows.append(translate(args, pool_name, device, model, pairs))
        del model
        release_cached(args.device)
    print_table("Summary (peaks: the most at an iteration's end, every iteration counted; "
                "ms/iter: median after the first iteration)", SUMMARY_COLUMNS, rows)


if __name__ == "__main__":
    sys.exit(programs.run(main))
