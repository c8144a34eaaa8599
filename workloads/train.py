"""Data-parallel training of a small decoder-only transformer LM with JAX under Ray Train.

The same file runs in three places:

* on the cluster, as the RayJob entrypoint (mounted from a ConfigMap as a single file, so it imports
  nothing from this repository): ``python train.py --use-tpu --topology 4x4 --accelerator-type TPU-V6E
  --num-workers 4 --chips-per-host 4 --storage-path gs://BUCKET/ray --checkpoint-dir gs://BUCKET/orbax/RUN ...``;
* locally, ``python workloads/train.py``: two CPU worker processes, one JAX device each, joined by
  ``jax.distributed`` so that they behave like two TPU hosts (2 global devices);
* in tests and benchmarks, imported as a module from its path (importing does no work; JAX is imported
  inside functions so that the Ray driver never initialises a JAX backend, which on a TPU VM would take
  the TPU lock away from the workers).

What it trains: a GPT-style model (token + position embeddings, pre-LayerNorm blocks with causal
multi-head attention and a GELU MLP, output head tied to the token embedding) on synthetic text from a
fixed random first-order Markov chain over ``vocab`` tokens. Each token has 4 likely successors, and with
probability 0.1 the next token is uniform noise, so the best achievable loss is about 1.9 nats against
log(vocab) = 4.85 for the uniform guess at the default vocab of 128.

Parallelism: one ``Mesh`` over every device of every host with a single axis ``"data"``; parameters and
optimizer state are replicated, the batch is sharded on ``"data"``. Every host generates only its own
slice of the global batch, which is a pure function of (seed, step, process index): a resumed run sees
exactly the batches an uninterrupted run would have seen.

Fault tolerance: orbax checkpoints under ``--checkpoint-dir`` (shared by all hosts) hold the model state
and are the source of truth; every process saves collectively. Rank 0 also reports a tiny Ray checkpoint
(``meta.json`` with the step) so that Ray's bookkeeping and ``Result`` stay consistent.

One job can run twice at once: MultiKueue re-dispatches it to another cluster when the first one is cut
off, and both runs go on until the partition heals, with the same flags. So every run has a writer
identity, ``--run-id`` (on KubeRay: the RayCluster's name, new for every dispatch and every RayJob retry),
and writes only its own files::

    <checkpoint-dir>/runs/<run-id>/<step>/...   orbax steps of this run (a CheckpointManager of its own)
    <checkpoint-dir>/runs/<run-id>/goodput/     its goodput records (--goodput-logger file) and result
    <storage-path>/<run-name>/<run-id>/         its Ray Train run (RunConfig name "<run-name>/<run-id>")

At start, rank 0 looks at every ``runs/*`` directory, takes the newest *finished* orbax step of any run
(orbax lists only finalized steps; a concurrent writer's tmp directories do not count; ties go to this
run, then to the greatest run id) and broadcasts the choice, so all processes restore the same step even
while another run is writing. Training then saves into this run's directory only. So a restarted worker
group (``FailureConfig(max_failures)``), a new ``fit()`` with the same flags and a new dispatch all
continue from the newest step that any run finished. (The Ray marker can lag behind: a report that the
controller has not collected when a worker dies is dropped, so a restart may see an older Ray checkpoint,
or none, while orbax has the step. Orbax decides where training resumes.)

Termination notice: GKE gives a Spot VM's pods 15 s, and a TPU host maintenance more, between its notice and the
end (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms). The SIGTERM goes to the container's
``ray start --block``, which in Ray 2.60 first drains the node for up to 30 s and never signals the training workers
within 15 s (ray/_private/node.py); so the RayJob's worker pods have a preStop hook (workloads/rayjob.py) that creates
``--notice-file`` at the start of the grace period. Every process looks for it after each step, and the hosts agree
(one tiny all-gather: a maintenance may warn one host of the slice only). Once any host has it, all of them save the
step they reached, report it, and exit with ``TerminationNotice``: a preemption with notice loses no finished step.
Without notice (a host that fails), the loss is at most ``--checkpoint-every`` steps.

Checkpoint request: the failover controller asks for a save ahead of a disruption it sees coming (a maintenance
window, a DWS run's end) or before a move, by annotating the TPU worker pods ``tpu-fallback/checkpoint-request:
<id> <time>`` (failover/checkpoints.py). The pods see their annotations in ``--pod-annotations-file``, a downwardAPI
volume (workloads/rayjob.py) that the kubelet rewrites when it syncs the pod (within its sync period, 1 minute by
default). Every process reads it after each step, in the same all-gather as the notice; on an id no host has honoured
yet, all of them save the step they reached and go on training. A worker group takes the request it sees at its start
as honoured: it has just restored its newest step.

Metrics, reported through ``ray.train.report`` every ``--report-every`` steps and at every checkpoint:
loss, global tokens/s, step time, model TFLOP/s per device and, given ``--peak-tflops-per-device``, MFU.

Goodput: rank 0 records the job's events with Google's ml-goodput-measurement (the recorder MaxText uses): each worker
group's start (the job's first, or a restart after a disruption), TPU initialisation, training preparation, each step's
start, orbax's save and restore events, the wait for a save's commit, and the step up to which a run kept its progress.
The records go to JSON lines in the run's own ``<checkpoint-dir>/runs/<run-id>/goodput/records.jsonl``, or, with
``--goodput-logger cloud``, to Cloud Logging, as the library does. Object storage (gs://) cannot append: there the
lines collect in a local file in the pod, and the records object is written whole at each checkpoint save and at the
run's end (a pod that dies between two saves loses its records since the last one). When fit() ends, the
driver runs the library's calculator over the run's records and writes ``runs/<run-id>/goodput/result.json``: goodput,
and badput by cause, as fractions of the run's time and in seconds. The job's goodput is derived when read, over every
run's records, and written nowhere: ``python train.py <the job's flags> --goodput-report`` prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import socket
import sys
import tempfile
import time

import numpy as np

# --------------------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------------------

# Probabilities of a token's 4 successors, used when the next token is not noise.
SUCCESSOR_PROBS = (0.5, 0.25, 0.15, 0.10)
NOISE_PROB = 0.1  # probability that the next token is uniform over the vocabulary


def markov_successors(seed: int, vocab: int) -> np.ndarray:
    """The "language": for each token, its 4 likely successors. Fixed by the seed alone."""
    rng = np.random.default_rng([seed, 0x5EED])
    return rng.integers(0, vocab, size=(vocab, len(SUCCESSOR_PROBS)), dtype=np.int64)


def synthetic_batch(seed: int, step: int, process_index: int, batch_size: int, seq_len: int,
                    vocab: int) -> np.ndarray:
    """This process's slice of the batch of global step ``step``: int32 [batch_size, seq_len + 1].

    A pure function of its arguments (no hidden state), which is what makes resume exact.
    """
    successors = markov_successors(seed, vocab)
    rng = np.random.default_rng([seed, step, process_index])
    tokens = np.empty((batch_size, seq_len + 1), dtype=np.int32)
    tokens[:, 0] = rng.integers(0, vocab, size=batch_size)
    choice = rng.choice(len(SUCCESSOR_PROBS), size=(batch_size, seq_len), p=SUCCESSOR_PROBS)
    noise = rng.random((batch_size, seq_len)) < NOISE_PROB
    noise_tokens = rng.integers(0, vocab, size=(batch_size, seq_len))
    for t in range(seq_len):
        follow = successors[tokens[:, t], choice[:, t]]
        tokens[:, t + 1] = np.where(noise[:, t], noise_tokens[:, t], follow)
    return tokens


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 128
    seq_len: int = 64
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    dtype: str = "float32"  # matmul dtype; parameters, LayerNorm, softmax and loss stay float32

    @property
    def d_mlp(self) -> int:
        return self.mlp_ratio * self.d_model


def init_params(cfg: ModelConfig, key) -> dict:
    """GPT-2 style initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers)."""
    import jax
    import jax.numpy as jnp

    d, f = cfg.d_model, cfg.d_mlp
    keys = iter(jax.random.split(key, 2 + 4 * cfg.layers))
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * cfg.layers)

    def dense(n_in, n_out, scale):
        return {"w": scale * jax.random.normal(next(keys), (n_in, n_out), jnp.float32),
                "b": jnp.zeros((n_out,), jnp.float32)}

    def norm():
        return {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)}

    return {
        "tok_emb": std * jax.random.normal(next(keys), (cfg.vocab, d), jnp.float32),
        "pos_emb": std * jax.random.normal(next(keys), (cfg.seq_len, d), jnp.float32),
        "blocks": [{"ln1": norm(), "qkv": dense(d, 3 * d, std), "attn_out": dense(d, d, proj_std),
                    "ln2": norm(), "mlp_in": dense(d, f, std), "mlp_out": dense(f, d, proj_std)}
                   for _ in range(cfg.layers)],
        "ln_f": norm(),
    }


def _layer_norm(x, p, eps=1e-5):
    import jax
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def _dense(x, p, dtype):
    import jax.numpy as jnp
    # Matmul in `dtype` (bf16 on accelerators) with a float32 accumulator and residual stream.
    return jnp.dot(x.astype(dtype), p["w"].astype(dtype), preferred_element_type=jnp.float32) + p["b"]


def _attention(x, p, cfg: ModelConfig, dtype):
    import jax
    import jax.numpy as jnp
    b, t, d = x.shape
    hd = d // cfg.heads
    q, k, v = jnp.split(_dense(x, p["qkv"], dtype), 3, axis=-1)
    q, k, v = (a.reshape(b, t, cfg.heads, hd).astype(dtype) for a in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))  # query q sees keys k <= q only
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v, preferred_element_type=jnp.float32)
    return _dense(out.reshape(b, t, d), p["attn_out"], dtype)


def forward(params: dict, tokens, cfg: ModelConfig):
    """Logits float32 [B, T, vocab] for int tokens [B, T] (T <= cfg.seq_len)."""
    import jax
    import jax.numpy as jnp
    dtype = jnp.dtype(cfg.dtype)
    x = params["tok_emb"][tokens] + params["pos_emb"][: tokens.shape[1]]
    for blk in params["blocks"]:
        x = x + _attention(_layer_norm(x, blk["ln1"]), blk, cfg, dtype)
        h = jax.nn.gelu(_dense(_layer_norm(x, blk["ln2"]), blk["mlp_in"], dtype))
        x = x + _dense(h, blk["mlp_out"], dtype)
    x = _layer_norm(x, params["ln_f"])
    # Tied output head: the token embedding matrix, transposed.
    return jnp.einsum("btd,vd->btv", x.astype(dtype), params["tok_emb"].astype(dtype),
                      preferred_element_type=jnp.float32)


def loss_fn(params: dict, batch, cfg: ModelConfig):
    """Mean next-token cross-entropy (nats) on int [B, T + 1] token windows."""
    import jax
    import jax.numpy as jnp
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logp = jax.nn.log_softmax(forward(params, inputs, cfg), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def num_params(cfg: ModelConfig, include_position_embedding: bool = True) -> int:
    """Exact parameter count of ``init_params(cfg)``, from the shapes."""
    d, f = cfg.d_model, cfg.d_mlp
    per_block = (2 * 2 * d              # two LayerNorms (scale, bias)
                 + d * 3 * d + 3 * d     # qkv
                 + d * d + d             # attention output
                 + d * f + f + f * d + d)  # MLP
    total = cfg.vocab * d + cfg.layers * per_block + 2 * d  # embedding (= tied head), blocks, final LN
    return total + (cfg.seq_len * d if include_position_embedding else 0)


def flops_per_token(cfg: ModelConfig) -> int:
    """Model FLOPs of one training token (forward + backward), as in PaLM appendix B / nanoGPT:

        6 * N  +  12 * layers * seq_len * d_model

    6 * N: each parameter takes part in one multiply-add (2 FLOPs) per token in the forward pass and two in
    the backward pass. N counts every parameter except the position embedding (a lookup, not a matmul);
    the token embedding counts once, because it is the tied output head's matmul. Biases and LayerNorm
    are included as nanoGPT does (they are O(d) against O(d^2)).
    12 * L * T * d: attention scores Q.K^T and the weighted sum A.V, 2 * T * d FLOPs each per token and
    layer forward, times 3 for forward + backward. The causal half is not subtracted because this
    implementation computes the full T x T score matrix.
    Remat would add work that this model-FLOPs count deliberately ignores (MFU, not HFU).
    """
    return 6 * num_params(cfg, include_position_embedding=False) + 12 * cfg.layers * cfg.seq_len * cfg.d_model


# --------------------------------------------------------------------------------------------------
# Optimizer, sharding and the jitted train step
# --------------------------------------------------------------------------------------------------


def make_optimizer(lr: float, warmup_steps: int, weight_decay: float = 0.01):
    """AdamW with linear warmup, then a constant rate.

    Constant rather than cosine on purpose: the schedule does not depend on --steps, so a run extended
    with more steps (a second fit() with the same run name) continues on the same curve.
    """
    import jax
    import optax
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, lr, max(warmup_steps, 1)), optax.constant_schedule(lr)],
        boundaries=[max(warmup_steps, 1)])
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # no decay on biases/LN
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay, mask=decay_mask))


def make_mesh(devices=None):
    """1-D mesh named "data" over the given devices (default: every device of every process)."""
    import jax
    from jax.sharding import Mesh
    return Mesh(np.array(devices if devices is not None else jax.devices()), ("data",))


def create_state(cfg: ModelConfig, optimizer, seed: int, mesh) -> dict:
    """{"step", "params", "opt_state"}, created replicated over the mesh.

    Initialising inside jit with replicated out_shardings works identically with one process or many;
    every process computes the same values from the same seed.
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    def init():
        params = init_params(cfg, jax.random.PRNGKey(seed))
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optimizer.init(params)}

    return jax.jit(init, out_shardings=NamedSharding(mesh, P()))()


def make_train_step(cfg: ModelConfig, optimizer, mesh):
    """Jitted ``(state, batch) -> (state, loss)``; state replicated, batch sharded on "data".

    XLA inserts the gradient all-reduce across devices (and hosts) because the batch is sharded and the
    parameters are not. The loss is that of the parameters before the update.
    """
    import jax
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def step(state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch, cfg)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, loss

    return jax.jit(step, in_shardings=(replicated, sharded), out_shardings=(replicated, replicated),
                   donate_argnums=0)


def shard_batch(local_tokens: np.ndarray, mesh):
    """Global batch array from each process's local slice (rows ordered by process index)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local_tokens)


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------


RUNS_DIR = "runs"  # <checkpoint-dir>/runs/<run-id>/: one orbax directory per writer
_RUN_ID = re.compile(r"[A-Za-z0-9_.-]+")


def valid_run_id(value: str) -> str:
    """A run id names a directory: letters, digits, "-", "_", "." only, and not "." or ".."."""
    if not _RUN_ID.fullmatch(value) or value in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"run id {value!r} is not a path-safe name (letters, digits, '-', '_', '.')")
    return value


def run_checkpoint_dir(checkpoint_dir: str, run_id: str) -> str:
    """The orbax directory that run ``run_id`` writes (and only it)."""
    return f"{checkpoint_dir.rstrip('/')}/{RUNS_DIR}/{run_id}"


def checkpoint_manager(directory: str, read_only: bool = False, logger=None):
    """``logger``: where orbax logs its save and restore events (``checkpoint_event_logger``); None: orbax's default."""
    import orbax.checkpoint as ocp
    if read_only:  # another run's directory (or an offline reader): never create, save or delete there
        return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True), logger=logger)
    # max_to_keep=3 bounds storage; save() is only called on checkpoint steps, so no interval policy.
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=3, create=True),
                                 logger=logger)


def choose_resume_run(latest_steps: dict, own_run_id: str) -> str | None:
    """The run to resume from, given {run_id: newest finished step or None}: the newest step wins; on a tie
    this run's own, then the greatest run id. Deterministic, so any process would choose the same."""
    finished = {run: step for run, step in latest_steps.items() if step is not None}
    if not finished:
        return None
    return max(finished, key=lambda run: (finished[run], run == own_run_id, run))


def latest_steps(checkpoint_dir: str) -> dict:
    """{run_id: newest finished orbax step or None} for every run directory under ``checkpoint_dir``.

    Safe to call from one process of many: it only lists. (A CheckpointManager, even read-only, waits in
    its constructor for every process: orbax 0.12.8 CheckpointManager._maybe_save_root_metadata.)
    """
    import orbax.checkpoint as ocp
    from etils import epath  # orbax's own path layer; handles local paths and gs://
    runs = epath.Path(checkpoint_dir) / RUNS_DIR
    if not runs.exists():
        return {}
    # The listing CheckpointManager does, with orbax's finalization test (renamed tmp dir; commit_success.txt
    # on gs://): a step that a concurrent writer has not finished is not a resume point.
    name_format = ocp.path.step.standard_name_format()
    return {run.name: max((m.step for m in name_format.find_all(run)), default=None)
            for run in runs.iterdir() if run.is_dir() and _RUN_ID.fullmatch(run.name)}


def load_checkpoint(directory: str, cfg: ModelConfig, step: int | None = None, lr: float = 1e-2,
                    warmup_steps: int = 10, seed: int = 0) -> dict:
    """Read one orbax step (default: the newest) of one run's directory (``run_checkpoint_dir``) into host
    numpy arrays, in a single local process.

    The optimizer arguments only shape the restore target; they must match the run's for opt_state.
    """
    import jax
    import orbax.checkpoint as ocp
    mngr = checkpoint_manager(directory, read_only=True)
    step = mngr.latest_step() if step is None else step
    target = create_state(cfg, make_optimizer(lr, warmup_steps), seed, make_mesh(jax.local_devices()[:1]))
    state = mngr.restore(step, args=ocp.args.StandardRestore(target))
    mngr.close()
    return jax.tree.map(np.asarray, state)


class TerminationNotice(RuntimeError):
    """This run saved the step it reached on GKE's termination notice and ends; the next run resumes from it."""


def _notice_once(checkpoint_dir: str, notice_file: str, step: int) -> None:
    """Testing: the termination notice at ``step``, once (marker in the checkpoint root, as ``_fail_once``), created
    where the preStop hook creates it on the cluster."""
    from etils import epath
    marker = epath.Path(checkpoint_dir) / f"injected-notice-at-step-{step}"
    if marker.exists():
        return
    marker.write_text(str(time.time()))
    os.makedirs(os.path.dirname(notice_file) or ".", exist_ok=True)
    with open(notice_file, "w") as f:
        f.write(f"injected at step {step}\n")
    _log(f"[preempt-at-step] termination notice at step {step} ({notice_file})")


def checkpoint_request_id(annotations_file: str) -> str | None:
    """The id of the checkpoint request in a downwardAPI annotations file (``key="value"`` lines, each value quoted
    as Go's %q writes it), or None: no file, no request, or one that cannot be read."""
    try:
        with open(annotations_file) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, quoted = line.partition("=")
        if key != CHECKPOINT_REQUEST_ANNOTATION:
            continue
        try:
            value = json.loads(quoted)  # the ids and times the controller writes quote the same in Go and JSON
        except ValueError:
            return None
        request_id = value.split(" ", 1)[0] if isinstance(value, str) else ""
        return request_id or None
    return None


def _request_hash(annotations_file: str) -> int:
    """The checkpoint request on this host as a number the hosts can all-gather (0: none): 28 bits, an int32 as JAX
    gathers it without x64."""
    request_id = checkpoint_request_id(annotations_file)
    return 0 if request_id is None else int(hashlib.sha256(request_id.encode()).hexdigest()[:7], 16) or 1


def _signals_anywhere(notice_file: str, annotations_file: str, n_proc: int) -> tuple[bool, set[int]]:
    """Whether any host of the slice has the termination notice, and the checkpoint requests the hosts see (one
    all-gather for both: every process calls it)."""
    here = np.array([os.path.exists(notice_file), _request_hash(annotations_file)], dtype=np.int32)
    if n_proc == 1:
        gathered = here[None]
    else:
        from jax.experimental import multihost_utils
        gathered = np.asarray(multihost_utils.process_allgather(here)).reshape(n_proc, 2)
    return bool(gathered[:, 0].any()), {int(h) for h in gathered[:, 1] if h}


def _request_once(checkpoint_dir: str, annotations_file: str, step: int) -> None:
    """Testing: a checkpoint request at ``step``, once (marker in the checkpoint root), in the file the pods'
    downwardAPI volume holds on the cluster; replaced whole, as the kubelet does."""
    from etils import epath
    marker = epath.Path(checkpoint_dir) / f"injected-request-at-step-{step}"
    if marker.exists():
        return
    marker.write_text(str(time.time()))
    os.makedirs(os.path.dirname(annotations_file) or ".", exist_ok=True)
    with open(annotations_file + ".tmp", "w") as f:
        f.write(f'{CHECKPOINT_REQUEST_ANNOTATION}="injected-at-step-{step} 2026-01-01T00:00:00Z"\n')
    os.replace(annotations_file + ".tmp", annotations_file)
    _log(f"[request-at-step] checkpoint request at step {step} ({annotations_file})")


def _fail_once(checkpoint_dir: str, step: int) -> None:
    """Failure injection: kill this worker process the first time any attempt reaches ``step``.

    The marker file lives at the checkpoint root (shared storage, above the run directories), so the
    restarted worker group and later fit() calls find it and go on.
    """
    from etils import epath  # orbax's own path layer; handles local paths and gs://
    marker = epath.Path(checkpoint_dir) / f"injected-failure-at-step-{step}"
    if marker.exists():
        return
    marker.write_text(str(time.time()))
    _log(f"[fail-at-step] worker exits at step {step} (marker {marker})")
    os._exit(1)  # like a killed pod: no exception handling, no cleanup


# Where the worker pods' preStop hook writes the termination notice (workloads/rayjob.py imports this name).
DEFAULT_NOTICE_FILE = "/tmp/tpu-fallback/termination-notice"
# The TPU worker pods' own annotations, a downwardAPI volume (workloads/rayjob.py imports these names), and the one
# that asks for a save (failover.api.CHECKPOINT_REQUEST_ANNOTATION: this file imports nothing of the repository).
DEFAULT_POD_ANNOTATIONS_FILE = "/etc/tpu-fallback/pod/annotations"
CHECKPOINT_REQUEST_ANNOTATION = "tpu-fallback/checkpoint-request"

# --------------------------------------------------------------------------------------------------
# Goodput: Google's ml-goodput-measurement records the job's events; its calculator turns them into goodput
# (productive step time over job time) and badput by cause. Ref: https://github.com/AI-Hypercomputer/ml-goodput-measurement
# --------------------------------------------------------------------------------------------------

GOODPUT_LOG_NAME = "tpu-fallback-goodput"  # the records' log: one per Cloud Logging project, one job_name per job
# A run's goodput files sit in its own directory, beside its orbax steps (orbax lists only step-named entries there):
# two runs of one job never write the same path, and a run's directory holds all of its files.
GOODPUT_DIR = "goodput"  # <checkpoint-dir>/runs/<run-id>/goodput/
GOODPUT_RECORDS = "records.jsonl"  # the file logger's records of this run
GOODPUT_RESULT = "result.json"  # the calculator's result for this run, written when its fit() ends
# Where the records of a run whose records file is an object (gs://) collect in the pod between two uploads.
GOODPUT_SPOOL_DIR = "tpu-fallback-goodput"  # under the pod's temporary directory
# Training waits for orbax's background commit after every save (the Ray marker must not name an unfinished step);
# orbax's save event times only the blocking part, so the wait is recorded as a custom badput event of its own.
CHECKPOINT_SAVE_WAIT = "checkpoint_save_wait"
GOODPUT_LOGGERS = ("auto", "cloud", "file", "off")


def goodput_job_name(run_name: str, checkpoint_dir: str) -> str:
    """The job in goodput records: its run name and a hash of its checkpoint root. The root is the job's identity (every
    restart, RayJob retry and dispatch that resumes from it is the same job), and stacks that share a Cloud Logging
    project have the same job names but not the same bucket. Path-safe: the calculator names cache files after it."""
    digest = hashlib.sha256(checkpoint_dir.rstrip("/").encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '-', run_name)}-{digest}"


class GoodputFileLogger:
    """The library's Cloud Logging logger (ml_goodput_measurement.src.goodput._CloudLogger: write_cloud_logging_entry,
    read_cloud_logging_entries, flush) backed by JSON lines, for where there is no Cloud Logging: locally and in tests.
    Also orbax's checkpoint logger (log_entry, as orbax's CloudLogger), so save and restore events land beside them.

    A run appends to its own ``records.jsonl`` (``run_goodput_dir``) only: a local file directly; an object (gs://)
    through a local file in the pod, its spool, which ``flush`` writes to the object whole (``upload_records``). It
    reads back its own records, or, with ``every_run``, every run's of the job merged in time order: the job as Cloud
    Logging holds it (the library's query names the job only), which the job's view (``job_goodput``) computes over.
    """

    def __init__(self, checkpoint_dir: str, job_name: str, run_id: str = "local", every_run: bool = False):
        self.checkpoint_dir, self.job_name, self.run_id, self.every_run = checkpoint_dir, job_name, run_id, every_run
        self.path = f"{run_goodput_dir(checkpoint_dir, valid_run_id(run_id))}/{GOODPUT_RECORDS}"
        self.spool = records_spool(self.path) if _is_uri(self.path) else self.path  # where this process appends
        self._written = 0

    def write_cloud_logging_entry(self, entry: dict | None) -> None:
        if entry is None or entry.get("job_name") != self.job_name:  # as the library's logger: this job's only
            return
        self._written += 1
        line = json.dumps({"timestamp": time.time(), "id": f"{os.getpid()}-{self._written}", "payload": entry},
                          default=str)
        os.makedirs(os.path.dirname(self.spool), exist_ok=True)
        with open(self.spool, "a") as f:  # one write per line, O_APPEND: the driver and rank 0 share the file
            f.write(line + "\n")

    def log_entry(self, entry: dict, severity: str = "INFO") -> None:
        """orbax.checkpoint.logging.AbstractLogger's one method; orbax's CloudLogger tags entries with the job too."""
        self.write_cloud_logging_entry({**entry, "job_name": self.job_name})

    def flush(self) -> None:
        """A local file: every write is on disk when it returns. An object: written now, whole, from the spool. The
        recorder's flush calls it (each checkpoint save, a run's end); an upload that fails is logged, never raised:
        the records are a report, and the next flush writes them all again."""
        if self.spool == self.path:
            return
        try:
            upload_records(self.spool, self.path)
        except Exception as err:  # noqa: BLE001 - e.g. storage unreachable for a while
            _log(f"[goodput] records not written to {self.path}: {type(err).__name__}: {err}")

    def record_files(self) -> dict:
        """{run_id: its records file} of the runs this logger reads: its own, or every run's under ``runs/``."""
        from etils import epath  # orbax's own path layer: local paths and gs://
        if not self.every_run:
            return {self.run_id: self.path} if epath.Path(self.path).exists() else {}
        runs = epath.Path(self.checkpoint_dir) / RUNS_DIR
        found = {run: f"{run_goodput_dir(self.checkpoint_dir, run)}/{GOODPUT_RECORDS}"
                 for run in (sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []) if _RUN_ID.fullmatch(run)}
        return {run: path for run, path in found.items() if epath.Path(path).exists()}

    def records_by_run(self) -> dict:
        """{run_id: that run's records of this job, oldest first}: [{"timestamp", "id", "payload"}]. In object storage,
        what the run's last upload wrote."""
        from etils import epath
        by_run = {}
        for run, path in self.record_files().items():
            found = [json.loads(line) for line in epath.Path(path).read_text().splitlines() if line.strip()]
            by_run[run] = sorted((r for r in found if r["payload"].get("job_name") == self.job_name),
                                 key=lambda r: r["timestamp"])
        return by_run

    def records(self) -> list:
        """The records this logger reads, every run's merged, oldest first."""
        return sorted((r for rs in self.records_by_run().values() for r in rs), key=lambda r: r["timestamp"])

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        """The library's query: payloads in (start, end] (after ``last_entry_info``'s entry, if given), oldest first,
        and the (timestamp, id) of the last one."""
        import datetime
        # Compared as the library passes them back: datetimes (microseconds), with the entry's id after a tie.
        dated = [(datetime.datetime.fromtimestamp(r["timestamp"], datetime.timezone.utc), r) for r in self.records()]
        after = tuple(last_entry_info) if last_entry_info else None
        start = start_time if after is None else None
        chosen = [(when, r) for when, r in dated if (end_time is None or when <= end_time)
                  and (start is None or when > start) and (after is None or (when, r["id"]) > after)]
        last = (chosen[-1][0], chosen[-1][1]["id"]) if chosen else (None, None)
        return [r["payload"] for _, r in chosen], last


def _write_whole(path: str, text: str) -> None:
    """A reader sees the previous text or this one: an object store writes an object whole; a file is replaced."""
    if _is_uri(path):
        from etils import epath  # orbax's own path layer: gs:// through gcsfs
        epath.Path(path).write_text(text)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)


def records_spool(records_uri: str) -> str:
    """The local file in the pod where the records of ``records_uri`` collect between two uploads: one per records
    object, so the recorder and orbax's event logger of a process, and a worker group restarted in the same pod, add
    to the same lines."""
    name = hashlib.sha256(records_uri.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), GOODPUT_SPOOL_DIR, f"{name}.jsonl")


def upload_records(spool: str, records_uri: str) -> None:
    """Write a run's records object whole: the lines it holds and this pod's spool, each line once, in time order.

    Why whole: object storage cannot append; an object is replaced whole, so a reader sees one upload or the next.
    Why merged: one run has several writers, each with its spool in its own pod (the driver records the job's start,
    each worker group's rank 0 the rest), and they write in turn (the driver before fit(), one worker group at a time),
    so reading what is there and adding this pod's lines keeps every writer's.
    What is lost: a pod that dies without notice loses its lines since its last upload, i.e. since the run's last
    checkpoint save. Acceptable: those steps are lost to the training as well (the next run resumes from that save),
    and the run's and the job's goodput are computed when read, over the records that exist, where the time after the
    last save counts as the disruption it was (with notice the run saves, and uploads, first: nothing is lost).
    Ref: https://cloud.google.com/storage/docs/objects (objects are immutable: replaced whole, never appended to)"""
    from etils import epath
    if not os.path.exists(spool):  # this pod has recorded nothing
        return
    try:
        uploaded = epath.Path(records_uri).read_text()
    except FileNotFoundError:
        uploaded = ""
    with open(spool) as f:
        local = f.read()
    lines = {line for line in (uploaded + "\n" + local).splitlines() if line.strip()}
    ordered = sorted(lines, key=lambda line: (json.loads(line)["timestamp"], line))
    _write_whole(records_uri, "".join(line + "\n" for line in ordered))


def run_goodput_dir(checkpoint_dir: str, run_id: str) -> str:
    """Where run ``run_id`` keeps its goodput records and result: inside its own directory, as its orbax steps."""
    return f"{run_checkpoint_dir(checkpoint_dir, run_id)}/{GOODPUT_DIR}"


def goodput_logger(config: dict, every_run: bool = False) -> GoodputFileLogger | None:
    """The records' logger for the library: ours where config says "file" (reading this run's records, or with
    ``every_run`` the job's); None lets the library create its own Cloud Logging logger (on GKE, through the pod's
    Workload Identity), which reads every record of the job."""
    if config["goodput_logger"] != "file":
        return None
    return GoodputFileLogger(config["checkpoint_dir"], goodput_job_name(config["run_name"], config["checkpoint_dir"]),
                             config["run_id"], every_run=every_run)


def goodput_recorder(config: dict, enabled: bool):
    """The library's GoodputRecorder; every record_* call is a no-op where it is not enabled (all ranks but 0, as the
    library asks, or with --goodput-logger off), or where Cloud Logging's client cannot be made (no credentials): the
    library's writes are asynchronous and log their errors, so a recorder never fails the training."""
    from ml_goodput_measurement import goodput
    job_name = goodput_job_name(config["run_name"], config["checkpoint_dir"])
    if enabled and config["goodput_logger"] != "off":
        try:
            return goodput.GoodputRecorder(job_name, GOODPUT_LOG_NAME, logging_enabled=True,
                                           cloud_logger=goodput_logger(config))
        except Exception as err:  # noqa: BLE001 - google.auth's DefaultCredentialsError and the like
            _log(f"[goodput] not recorded: {type(err).__name__}: {err}")
    return goodput.GoodputRecorder(job_name, GOODPUT_LOG_NAME, logging_enabled=False)


class _CheckpointEvents:
    """orbax's logger interface (log_entry) around another logger: an event that cannot be written is logged, never
    raised. Orbax's CloudLogger writes synchronously inside CheckpointManager.save and restore, and a report must not
    fail a save."""

    def __init__(self, logger):
        self.logger = logger

    def log_entry(self, entry: dict, *args, **kwargs) -> None:
        try:
            self.logger.log_entry(entry, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - e.g. Cloud Logging's write denied
            _log(f"[goodput] checkpoint event not recorded: {type(err).__name__}: {err}")


def checkpoint_event_logger(config: dict, enabled: bool) -> _CheckpointEvents | None:
    """Where orbax logs its save and restore events for the calculator: the records' log (rank 0's), else None (orbax's
    default, absl logging). Ref: orbax.checkpoint.logging.CloudLogger, which the library's calculator reads back."""
    if not enabled or config["goodput_logger"] == "off":
        return None
    if config["goodput_logger"] == "file":
        return _CheckpointEvents(goodput_logger(config))
    import orbax.checkpoint as ocp
    try:
        return _CheckpointEvents(ocp.logging.CloudLogger(ocp.logging.CloudLoggerOptions(
            job_name=goodput_job_name(config["run_name"], config["checkpoint_dir"]), logger_name=GOODPUT_LOG_NAME)))
    except Exception as err:  # noqa: BLE001 - no credentials: orbax logs its events as it does by default
        _log(f"[goodput] checkpoint events not recorded: {type(err).__name__}: {err}")
        return None


def _badput_by_name(values: dict, scale: float, like: dict | None = None) -> dict:
    """{BadputType: value or {event: value}} -> {"tpu_initialization": value * scale, ...}: JSON keys, the library's
    enum names (and its custom events', which it upper-cases) in lower case. Every key of ``like`` that ``values``
    lacks is there as nothing (0 or {})."""
    named = {kind.name.lower(): ({event.lower(): v * scale for event, v in value.items()} if isinstance(value, dict)
                                 else value * scale) for kind, value in values.items()}
    for kind, value in (like or {}).items():
        named.setdefault(kind, {} if isinstance(value, dict) else 0.0)
    return named


def goodput_account(config: dict, every_run: bool) -> dict:
    """The library's calculation over the records one logger reads (``goodput_logger``), as plain JSON: ``goodput``
    and ``badput`` as fractions of the time the records span (the library gives percent), ``seconds`` the same in
    seconds."""
    from ml_goodput_measurement import goodput
    job_name = goodput_job_name(config["run_name"], config["checkpoint_dir"])
    # A cache of its own per calculation: the library's default (/tmp/<job>_timeline.jsonl) would fold in the records
    # of an earlier job of the same name.
    with tempfile.TemporaryDirectory() as cache:
        calculator = goodput.GoodputCalculator(job_name, GOODPUT_LOG_NAME, cache_dir=cache,
                                               cloud_logger=goodput_logger(config, every_run=every_run))
        percent, breakdown, _ = calculator.get_job_goodput(include_badput_breakdown=True)
        details = calculator.get_job_goodput_details()
    return {
        "job": job_name,
        "records": config["goodput_logger"],
        "computed_at": time.time(),
        "goodput": percent / 100,
        "badput": (badput := _badput_by_name(breakdown, 1 / 100)),
        # The same kinds in seconds (the library leaves out the ones that did not occur).
        "seconds": {"job": details["total_elapsed_time"],
                    "productive": details["goodput_time"][goodput.GoodputType.TOTAL],
                    "badput": _badput_by_name(details["badput_time"], 1, like=badput)},
        "max_productive_step": details["max_productive_step"],
        "disruptions": details["disruption_count"],
    }


def goodput_result(config: dict, finished: bool) -> dict:
    """This run's goodput: the calculation over its own records (``scope`` "run"). Cloud Logging's entries name the job,
    not the run (the library's query filters on job_name), so with ``cloud`` records it is the job's as this run
    ends (``scope`` "job")."""
    return {**goodput_account(config, every_run=False), "run": config["run_id"],
            "scope": "run" if config["goodput_logger"] == "file" else "job",
            "finished": finished}  # False: this run ended early (its window ends now)


def overlapping_runs(spans: dict) -> list:
    """[[run, run], ...]: the pairs of runs whose records overlap in time, given {run_id: (first, last) timestamp}."""
    runs = sorted(spans)
    return [[a, b] for i, a in enumerate(runs) for b in runs[i + 1:]
            if spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]


def job_goodput(config: dict) -> dict:
    """The job's goodput, derived when read and written nowhere: the library's calculation over every run's records,
    merged in time order, as it reads a job from Cloud Logging. The library has no notion of a run: it reads one timeline
    per job_name, where a step begun again marks a disruption. So runs one after another (a restart, a new dispatch)
    make one account; runs at once (a fleet partition) interleave their steps, and ``overlapping`` names them: read each
    run's own result then. With ``cloud`` records ``runs`` and ``overlapping`` are None: the entries name no run.
    Ref: ml_goodput_measurement 0.2.3 goodput.py, GoodputCalculator._get_current_productive_and_unproductive_time."""
    account = goodput_account(config, every_run=True)
    if config["goodput_logger"] != "file":
        return {**account, "runs": None, "overlapping": None}
    by_run = goodput_logger(config, every_run=True).records_by_run()
    spans = {run: (rs[0]["timestamp"], rs[-1]["timestamp"]) for run, rs in by_run.items() if rs}
    return {**account, "runs": sorted(spans), "overlapping": overlapping_runs(spans)}


def goodput_result_path(config: dict) -> str:
    return f"{run_goodput_dir(config['checkpoint_dir'], config['run_id'])}/{GOODPUT_RESULT}"


def write_goodput_result(config: dict, finished: bool) -> dict | None:
    """This run's ``runs/<run-id>/goodput/result.json`` (whole, never half written) and one compact line in the driver's
    log; None, with the reason logged, when there is nothing to compute or the records cannot be read: goodput is a
    report, and must not fail a training that succeeded."""
    if config["goodput_logger"] == "off":
        return None
    try:
        result = goodput_result(config, finished)
        _write_whole(goodput_result_path(config), json.dumps(result, indent=1, sort_keys=True))
    except Exception as err:  # noqa: BLE001 - e.g. no records yet, Cloud Logging's read denied, storage unreachable
        _log(f"[goodput] not written: {type(err).__name__}: {err}")
        return None
    _log("[goodput] " + json.dumps(result, separators=(",", ":"), sort_keys=True))
    return result

# --------------------------------------------------------------------------------------------------
# The per-worker training loop
# --------------------------------------------------------------------------------------------------


def _log(message: str) -> None:
    # Not print(): Ray Train v2 patches print in workers and each line would reach the driver twice.
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _free_address() -> str:
    import ray.util
    with socket.socket() as s:
        s.bind(("", 0))
        return f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"


def _init_jax_distributed_cpu(rank: int, world: int) -> None:
    """Join CPU workers into one multi-process JAX, as JaxTrainer does for TPU hosts.

    JaxTrainer only calls jax.distributed.initialize for use_tpu/use_gpu, so CPU runs do it here, with
    rank 0's address shared through Ray Train's collective.
    """
    import jax
    from ray.train.collective import broadcast_from_rank_zero
    address = broadcast_from_rank_zero(_free_address() if rank == 0 else None)
    jax.distributed.initialize(address, num_processes=world, process_id=rank)


def model_config(config: dict) -> ModelConfig:
    return ModelConfig(vocab=config["vocab"], seq_len=config["seq_len"], d_model=config["d_model"],
                       layers=config["layers"], heads=config["heads"], dtype=config["dtype"])


def train_loop_per_worker(config: dict) -> None:
    """Runs on every worker (one per host). ``config`` is ``vars(args)`` from the CLI."""
    import jax
    import orbax.checkpoint as ocp
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    logging.getLogger("absl").setLevel(logging.WARNING)  # orbax logs every save at INFO through absl
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    # Rank 0 records; a worker group's start is the job's first start or its restart after a disruption, which the
    # library measures from the last step recorded before it (infrastructure recovery).
    recorder = goodput_recorder(config, enabled=rank == 0)
    recorder.record_job_start_time()
    recorder.record_tpu_init_start_time()
    if not config["use_tpu"] and world > 1:
        _init_jax_distributed_cpu(rank, world)  # on TPU, JaxTrainer has already done it

    cfg = model_config(config)
    mesh = make_mesh()  # the first jax.devices(): the backend (on a TPU host, the TPU) initialises here
    n_dev, n_proc, proc = jax.device_count(), jax.process_count(), jax.process_index()
    recorder.record_tpu_init_end_time()
    recorder.record_training_preparation_start_time()
    if config["batch_size"] % n_dev:
        raise ValueError(f"--batch-size {config['batch_size']} is not a multiple of {n_dev} devices")
    local_batch = config["batch_size"] // n_proc

    optimizer = make_optimizer(config["lr"], config["warmup_steps"])
    state = create_state(cfg, optimizer, config["seed"], mesh)
    train_step = make_train_step(cfg, optimizer, mesh)

    run_id, root = config["run_id"], config["checkpoint_dir"]
    own_dir = run_checkpoint_dir(root, run_id)
    events = checkpoint_event_logger(config, enabled=rank == 0)
    mngr = checkpoint_manager(own_dir, logger=events)  # collective (creates the directory): every process
    # Rank 0 chooses and broadcasts: another run may finish a step between two processes' listings.
    source = None
    if rank == 0:
        steps = latest_steps(root)
        chosen = choose_resume_run(steps, run_id)
        source = None if chosen is None else (chosen, steps[chosen])
    source = broadcast_from_rank_zero(source)
    recorder.record_training_preparation_end_time()  # the restore is orbax's event of its own
    start = 0
    if source is not None:
        source_run, source_step = source
        src = mngr if source_run == run_id else checkpoint_manager(run_checkpoint_dir(root, source_run),
                                                                   read_only=True, logger=events)
        state = src.restore(source_step, args=ocp.args.StandardRestore(state))
        if src is not mngr:
            src.close()
        start = int(state["step"])
    ray_ckpt = ray.train.get_checkpoint()
    if rank == 0:
        origin = f"run {source[0]!r}" if source else "nothing (no finished step under runs/)"
        _log(f"[train] run {run_id!r}: {n_proc} processes, {n_dev} {jax.devices()[0].platform} devices; "
             f"start at step {start}, resumed from {origin} (Ray checkpoint: "
             f"{ray_ckpt.path if ray_ckpt else None})")

    total, every = config["steps"], config["checkpoint_every"]
    step_flops = flops_per_token(cfg) * config["batch_size"] * cfg.seq_len
    common = {"start_step": start, "processes": n_proc, "devices": n_dev,
              "resumed_from": source[0] if source else ""}
    first_loss, t0, timed_steps, loss = None, 0.0, 0, None
    # Checkpoint requests already honoured: the one this group sees at its start (nothing is unsaved yet).
    honoured = _signals_anywhere(config["notice_file"], config["pod_annotations_file"], n_proc)[1]
    for step in range(start, total):  # state["step"] == step here
        recorder.record_step_start_time(step)
        local = synthetic_batch(config["seed"], step, proc, local_batch, cfg.seq_len, cfg.vocab)
        state, loss = train_step(state, shard_batch(local, mesh))
        done = step + 1
        if first_loss is None:
            first_loss = float(loss)  # blocks: the compile is kept out of the timed window
            t0, timed_steps = time.perf_counter(), 0
            common["first_step_at"] = time.time()  # this group's first step done: a restart's cost ends here
        else:
            timed_steps += 1
        if config["fail_at_step"] == done and rank == world - 1:
            _fail_once(root, done)
        if config["preempt_at_step"] == done and rank == world - 1:
            _notice_once(root, config["notice_file"], done)
        if config["request_at_step"] == done and rank == world - 1:
            _request_once(root, config["pod_annotations_file"], done)
        noticed, requests = _signals_anywhere(config["notice_file"], config["pod_annotations_file"], n_proc)
        requested = bool(requests - honoured)
        honoured |= requests

        is_ckpt = done % every == 0 or done == total or noticed or requested
        if not (is_ckpt or done % config["report_every"] == 0):
            continue
        metrics = {"step": done, "loss": float(loss), "first_loss": first_loss, **common}
        if timed_steps:  # end-to-end step time: host-side data generation and dispatch included
            dt = (time.perf_counter() - t0) / timed_steps
            tflops = step_flops / dt / n_dev / 1e12
            metrics.update(step_time_s=dt, tokens_per_s=config["batch_size"] * cfg.seq_len / dt,
                           tflops_per_device=tflops)
            if config["peak_tflops_per_device"]:
                metrics["mfu"] = tflops / config["peak_tflops_per_device"]
        if rank == 0:
            _log("[train] " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in metrics.items()))
        if is_ckpt:
            mngr.save(done, args=ocp.args.StandardSave(state))  # collective: every process calls it
            recorder.record_custom_badput_event_start_time(custom_badput_event_type=CHECKPOINT_SAVE_WAIT)
            mngr.wait_until_finished()  # the Ray marker must not point at a step orbax has not finished
            recorder.record_custom_badput_event_end_time(custom_badput_event_type=CHECKPOINT_SAVE_WAIT)
            recorder.flush()  # records in object storage are written at each save (GoodputFileLogger.flush)
        _report(metrics, done if (is_ckpt and rank == 0) else None, own_dir)
        t0, timed_steps = time.perf_counter(), 0
        if requested and not noticed and rank == 0:
            _log(f"[train] checkpoint request: saved step {done}; training on")
        if noticed:
            if os.path.exists(config["notice_file"]):
                os.remove(config["notice_file"])  # consumed: on a host that outlives the notice, it is not seen twice
            mngr.close()
            _record_progress_kept(recorder, done)
            if rank == 0:
                _log(f"[train] termination notice: saved step {done}; exiting")
            raise TerminationNotice(f"termination notice: saved step {done}")

    if start >= total:  # nothing left to do; still report once (a barrier like any other report)
        if rank == 0:
            _log(f"[train] already at step {start} of {total}: nothing to train (raise --steps to go on, "
                 f"or use a new --run-name or --checkpoint-dir to start over)")
        _report({"step": start, **common}, None, own_dir)
    mngr.wait_until_finished()
    mngr.close()
    _record_progress_kept(recorder, max(start, total))
    recorder.record_job_end_time()
    recorder.flush()


def _record_progress_kept(recorder, step: int) -> None:
    """The start of step ``step`` after its predecessor's checkpoint, though no step runs: the library reads a step
    recorded twice as a restart that kept every step before it. So the run that resumes at ``step`` counts the time in
    between as recovery, and the save before it as the last step's, instead of one long productive step.
    Ref: ml_goodput_measurement 0.2.3 goodput.py, GoodputCalculator._get_current_productive_and_unproductive_time."""
    recorder.record_step_start_time(step)
    recorder.flush()


def _report(metrics: dict, marker_step: int | None, checkpoint_dir: str) -> None:
    """ray.train.report on every worker (it is a barrier); only rank 0 attaches the marker checkpoint."""
    import ray.train
    if marker_step is None:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "meta.json"), "w") as f:
            # Where this worker group began and when its first step was done: the markers stay on storage when a
            # report is dropped (a worker that dies before the controller collects it), so they tell each restart.
            json.dump({"step": marker_step, "orbax_dir": checkpoint_dir, "start_step": metrics.get("start_step"),
                       "first_step_at": metrics.get("first_step_at")}, f)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--num-workers", type=int, default=2, help="worker processes = hosts (TPU: hosts in the slice)")
    a("--steps", type=int, default=40, help="total training steps (a resumed run stops here too)")
    a("--batch-size", type=int, default=32, help="global batch, in sequences")
    a("--seq-len", type=int, default=64)
    a("--vocab", type=int, default=128)
    a("--d-model", type=int, default=64)
    a("--layers", type=int, default=2)
    a("--heads", type=int, default=4)
    a("--dtype", default="float32", choices=["float32", "bfloat16"], help="matmul dtype")
    a("--lr", type=float, default=1e-2)
    a("--warmup-steps", type=int, default=10)
    a("--seed", type=int, default=0)
    a("--storage-path", default=os.path.join(tempfile.gettempdir(), "tpu-fallback-train"),
      help="Ray Train storage (local dir or gs://...), shared by all nodes")
    a("--run-name", default="tpu-fallback-train",
      help="the job's name: its Ray Train runs are <storage-path>/<run-name>/<run-id>")
    a("--run-id", type=valid_run_id, default=None,
      help="this run's writer identity: it writes orbax steps under <checkpoint-dir>/runs/<run-id> only "
           "(default: $RAY_CLUSTER_NAME, else 'local')")
    a("--checkpoint-dir", default=None,
      help="the job's orbax root, shared by all hosts and runs; every run resumes from the newest finished "
           "step under it (default: <storage-path>/<run-name>-orbax)")
    a("--checkpoint-every", type=int, default=10)
    a("--report-every", type=int, default=10)
    a("--max-failures", type=int, default=2, help="worker-group restarts allowed (-1: unlimited)")
    a("--notice-file", default=DEFAULT_NOTICE_FILE,
      help="GKE's termination notice: created by the worker pods' preStop hook; seen on any host, every host saves "
           "the step it reached and exits")
    a("--pod-annotations-file", default=DEFAULT_POD_ANNOTATIONS_FILE,
      help="the worker pod's annotations (a downwardAPI volume); a new tpu-fallback/checkpoint-request on any host "
           "makes every host save the step it reached and train on")
    a("--request-at-step", type=int, default=None,
      help="testing: the last rank writes a checkpoint request into --pod-annotations-file after this step, once "
           "(marker in --checkpoint-dir)")
    a("--preempt-at-step", type=int, default=None,
      help="testing: the last rank creates --notice-file after this step, once (marker in --checkpoint-dir)")
    a("--fail-at-step", type=int, default=None,
      help="testing: the last rank exits after this step, once (marker in --checkpoint-dir, for all runs)")
    a("--goodput-logger", choices=GOODPUT_LOGGERS, default="auto",
      help="where goodput records go: file (JSON lines in <checkpoint-dir>/runs/<run-id>/goodput/records.jsonl; "
           "on gs:// written whole at each checkpoint save and at the end), cloud (Cloud Logging, the library's own; "
           "needs project-wide logging roles), off; auto: file. The run's result goes to "
           "<checkpoint-dir>/runs/<run-id>/goodput/result.json")
    a("--goodput-report", action="store_true",
      help="train nothing: print the job's goodput, computed now over every run's records (the same --run-name, "
           "--checkpoint-dir and --goodput-logger as the training)")
    a("--use-tpu", action="store_true")
    a("--topology", default=None, help='TPU slice topology, e.g. "4x4"')
    a("--accelerator-type", default=None, help='Ray TPU type: "TPU-V6E", "TPU-V5LITEPOD", "TPU-V5P"')
    a("--chips-per-host", type=int, default=4)
    a("--peak-tflops-per-device", type=float, default=None,
      help="peak dense bf16 TFLOP/s of one JAX device (a chip; a TensorCore on TPU7x), to report MFU")
    return p


def _is_uri(path: str) -> bool:
    return "://" in path


def resolve_config(args: argparse.Namespace) -> dict:
    config = vars(args).copy()
    if not _is_uri(config["storage_path"]):
        config["storage_path"] = os.path.abspath(config["storage_path"])
    if config["checkpoint_dir"] is None:
        config["checkpoint_dir"] = f"{config['storage_path'].rstrip('/')}/{config['run_name']}-orbax"
    elif not _is_uri(config["checkpoint_dir"]):
        config["checkpoint_dir"] = os.path.abspath(config["checkpoint_dir"])  # orbax wants absolute paths
    if config["run_id"] is None:
        # Read here, in the driver, once: the workers get this config, so every process agrees.
        # KubeRay sets RAY_CLUSTER_NAME on every Ray container from the pod label ray.io/cluster; the
        # RayCluster is "<rayjob>-<random suffix>", new per RayJob object (so per MultiKueue dispatch) and
        # per retry. Ref: github.com/ray-project/kuberay ray-operator@v1.6.2
        # controllers/ray/common/pod.go setContainerEnvVars (L842-850)
        try:
            config["run_id"] = valid_run_id(os.environ.get("RAY_CLUSTER_NAME") or "local")
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"RAY_CLUSTER_NAME: {err}; pass --run-id") from None
    if config["goodput_logger"] == "auto":
        # The records beside the checkpoints, wherever they are (on gs:// too, written whole at each save): that needs
        # only the rights the checkpoints need. Cloud Logging needs project-wide logging roles, so it is asked for.
        # Ref: workloads/rayjob.py entrypoint (the stack's RayJobs pass --goodput-logger file for that reason)
        config["goodput_logger"] = "file"
    return config


def make_trainer(config: dict):
    """The JaxTrainer for a resolved config (nothing runs until ``.fit()``)."""
    from ray import cloudpickle
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer

    if __name__ != "__main__":
        # Imported from a file path (tests, bench): workers cannot import this module by name, so ship
        # its functions by value, as happens anyway when it runs as __main__.
        cloudpickle.register_pickle_by_value(sys.modules[__name__])

    if config["use_tpu"]:
        # One worker per TPU host. Ray validates topology/accelerator_type against num_workers and
        # reserves the whole slice; JaxTrainer then runs jax.distributed.initialize on every host.
        scaling = ScalingConfig(num_workers=config["num_workers"], use_tpu=True, topology=config["topology"],
                                accelerator_type=config["accelerator_type"],
                                resources_per_worker={"TPU": config["chips_per_host"]})
        worker_env = {}
    else:
        scaling = ScalingConfig(num_workers=config["num_workers"], use_tpu=False,
                                resources_per_worker={"CPU": 1})
        # One CPU device per worker process even where an accelerator is present.
        worker_env = {"env_vars": {"JAX_PLATFORMS": "cpu"}}

    return JaxTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        scaling_config=scaling,
        # A Ray Train run directory per writer too: two runs of one job never share a run's files.
        run_config=RunConfig(name=f"{config['run_name']}/{config['run_id']}",
                             storage_path=config["storage_path"],
                             failure_config=FailureConfig(max_failures=config["max_failures"]),
                             worker_runtime_env=worker_env),
    )


def main(argv=None):
    """Train with JaxTrainer; returns the ``ray.train.Result`` (``.metrics``: last checkpoint's metrics).

    This run's goodput, over its records, goes to ``runs/<run-id>/goodput/result.json`` once fit() ends, however it
    ends (``write_goodput_result``). With ``--goodput-report``: prints and returns the job's (``job_goodput``)."""
    import datetime
    started = datetime.datetime.now(datetime.timezone.utc)
    config = resolve_config(build_parser().parse_args(argv))
    if config["goodput_report"]:
        report = job_goodput(config)
        print(json.dumps(report, indent=1, sort_keys=True), flush=True)
        return report
    # The program's start is the job's (a restarted worker group records its own start too).
    recorder = goodput_recorder(config, enabled=True)
    recorder.record_job_start_time(started)
    recorder.flush()
    finished = False
    try:
        result = make_trainer(config).fit()
        finished = True
    finally:
        write_goodput_result(config, finished)
    print("[train] final metrics: " + json.dumps(result.metrics, sort_keys=True, default=str), flush=True)
    return result


if __name__ == "__main__":
    main()
