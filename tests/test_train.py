"""Tests of workloads/train.py in-process: the model helpers, the data, the config, the choice of the resume source
and the TPU trainer's config, with real JAX on the CPU. The fits with real Ray Train are in test_train_ray.py (a
file of its own, so the suite's workers run the two at once).
"""

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TRAIN_PY = Path(__file__).resolve().parents[1] / "workloads" / "train.py"


# Imported as workloads.train here; on the cluster it runs as a single file (see the subprocess test).
from workloads import train  # noqa: E402



# --------------------------------------------------------------------------------------------------
# Fast unit tests of the model helpers (in-process JAX, one CPU device)
# --------------------------------------------------------------------------------------------------

TINY = train.ModelConfig(vocab=10, seq_len=3, d_model=4, layers=1, heads=2, mlp_ratio=4)


def test_import_does_no_work_and_does_not_import_jax():
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('t', %r); "
            "m = importlib.util.module_from_spec(s); sys.modules['t'] = m; s.loader.exec_module(m); "
            "assert 'jax' not in sys.modules and 'ray' not in sys.modules, sorted(sys.modules)" % str(TRAIN_PY))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_param_count_and_flops_formula_by_hand():
    # TINY: vocab 10, d 4, mlp 16, 1 layer, seq 3.
    # tok_emb 10*4=40; block: 2 LayerNorms 2*(4+4)=16, qkv 4*12+12=60, attn_out 4*4+4=20,
    # mlp_in 4*16+16=80, mlp_out 16*4+4=68 -> 244; final LayerNorm 8.  N (no position embedding) = 292.
    assert train.num_params(TINY, include_position_embedding=False) == 292
    assert train.num_params(TINY) == 292 + 3 * 4
    # 6 N + 12 * layers * seq_len * d_model = 6*292 + 12*1*3*4 = 1752 + 144
    assert train.flops_per_token(TINY) == 1896

    import jax
    params = train.init_params(TINY, jax.random.PRNGKey(0))
    assert sum(leaf.size for leaf in jax.tree.leaves(params)) == train.num_params(TINY)


def test_forward_shapes_and_initial_loss_near_uniform():
    import jax
    cfg = train.ModelConfig(vocab=32, seq_len=8, d_model=16, layers=2, heads=4)
    params = train.init_params(cfg, jax.random.PRNGKey(0))
    batch = train.synthetic_batch(0, 0, 0, batch_size=3, seq_len=8, vocab=32)
    assert batch.shape == (3, 9) and batch.dtype == np.int32
    logits = train.forward(params, batch[:, :-1], cfg)
    assert logits.shape == (3, 8, 32) and logits.dtype == np.float32
    # Small init gives near-uniform predictions: loss close to log(vocab).
    assert abs(float(train.loss_fn(params, batch, cfg)) - math.log(32)) < 0.1


def test_causal_mask_future_tokens_do_not_change_earlier_logits():
    import jax
    cfg = train.ModelConfig(vocab=32, seq_len=8, d_model=16, layers=2, heads=4)
    params = train.init_params(cfg, jax.random.PRNGKey(1))
    tokens = train.synthetic_batch(0, 0, 0, batch_size=2, seq_len=7, vocab=32)  # [2, 8]
    changed = tokens.copy()
    changed[:, 5:] = (changed[:, 5:] + 7) % 32
    a, b = np.asarray(train.forward(params, tokens, cfg)), np.asarray(train.forward(params, changed, cfg))
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=0, atol=1e-6)
    assert np.abs(a[:, 5:] - b[:, 5:]).max() > 1e-3  # and the test can see a change where there is one


def test_synthetic_data_is_a_pure_function_of_seed_step_process():
    args = dict(batch_size=4, seq_len=16, vocab=64)
    first = train.synthetic_batch(3, 7, 1, **args)
    np.testing.assert_array_equal(first, train.synthetic_batch(3, 7, 1, **args))
    for other in [(4, 7, 1), (3, 8, 1), (3, 7, 0)]:
        assert not np.array_equal(first, train.synthetic_batch(*other, **args)), other
    assert first.min() >= 0 and first.max() < 64

    # Learnable structure: ~90% of transitions go to one of the token's 4 successors (+ noise hits).
    big = train.synthetic_batch(3, 0, 0, batch_size=64, seq_len=64, vocab=64)
    successors = train.markov_successors(3, 64)
    follows = (successors[big[:, :-1]] == big[:, 1:, None]).any(-1).mean()
    assert 0.88 < follows < 0.95


def test_defaults_resolve_to_two_cpu_workers_and_a_checkpoint_dir_beside_the_run(monkeypatch):
    monkeypatch.delenv("RAY_CLUSTER_NAME", raising=False)
    config = train.resolve_config(train.build_parser().parse_args(["--storage-path", "rel/dir"]))
    assert config["num_workers"] == 2 and not config["use_tpu"] and config["max_failures"] == 2
    assert config["storage_path"] == str(Path("rel/dir").resolve())
    assert config["checkpoint_dir"] == config["storage_path"] + "/tpu-fallback-train-orbax"
    assert config["run_id"] == "local"
    assert train.run_checkpoint_dir(config["checkpoint_dir"] + "/", "local") == (
        config["checkpoint_dir"] + "/runs/local")


def _resolve(*argv: str) -> dict:
    parser = train.build_parser()
    parser.exit_on_error = False  # an invalid value raises ArgumentError instead of exiting
    return train.resolve_config(parser.parse_args(list(argv)))


def test_run_id_defaults_to_the_ray_cluster_name_and_must_be_path_safe(monkeypatch):
    # KubeRay sets RAY_CLUSTER_NAME, the RayCluster's name ("<rayjob>-<random suffix>"), on every Ray container.
    monkeypatch.setenv("RAY_CLUSTER_NAME", "rayjob-tpu-v6e-4x4-1-x7k2p")
    assert _resolve()["run_id"] == "rayjob-tpu-v6e-4x4-1-x7k2p"
    assert _resolve("--run-id", "dispatch_b.2")["run_id"] == "dispatch_b.2"  # the flag wins
    monkeypatch.setenv("RAY_CLUSTER_NAME", "")
    assert _resolve()["run_id"] == "local"
    for bad in ["a/b", "..", ".", "x y", "", "runs/../x"]:
        with pytest.raises(argparse.ArgumentError, match="path-safe"):
            _resolve("--run-id", bad)
    monkeypatch.setenv("RAY_CLUSTER_NAME", "../escape")
    with pytest.raises(ValueError, match="RAY_CLUSTER_NAME"):
        _resolve()


def test_resume_source_is_the_newest_finished_step_then_own_run_then_greatest_run_id():
    choose = train.choose_resume_run
    assert choose({}, "a") is None
    assert choose({"a": None, "b": None}, "a") is None  # run dirs without a finished step
    assert choose({"a": 10, "b": 20, "c": None}, "a") == "b"  # newest step, whoever wrote it
    assert choose({"a": 30, "b": 20}, "b") == "a"
    assert choose({"a": 20, "b": 20, "c": 20}, "b") == "b"  # tie: own run
    assert choose({"a": 20, "c": 20, "b": 10}, "b") == "c"  # tie, own run older: greatest id
    assert choose({"a": 20, "c": 20, "b": 10}, "z") == "c"  # own run has no directory yet
    assert choose({"a": 0, "b": None}, "b") == "a"  # step 0 is a step


def test_latest_steps_counts_only_finished_steps_of_valid_run_dirs(tmp_path):
    """A concurrent writer's step in progress (orbax's tmp directory) is not a resume point."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    root = tmp_path / "orbax"
    assert train.latest_steps(str(root)) == {}  # no runs/ yet: a fresh job
    mngr = train.checkpoint_manager(train.run_checkpoint_dir(str(root), "a"))
    for step in (10, 20):
        mngr.save(step, args=ocp.args.StandardSave({"w": jnp.arange(3.0) + step}))
    mngr.wait_until_finished()
    mngr.close()
    (root / "runs" / "a" / "30.orbax-checkpoint-tmp-1234").mkdir()  # step 30 still being written
    (root / "runs" / "b").mkdir()  # a run that has not finished a step
    (root / "runs" / "b" / "40.orbax-checkpoint-tmp-99").mkdir()
    (root / "runs" / "stray.txt").write_text("not a run")  # a file, not a run directory
    assert train.latest_steps(str(root)) == {"a": 20, "b": None}


@pytest.mark.parametrize("accelerator_type, topology, hosts", [
    ("TPU-V6E", "4x4", 4),        # v6e-16: 16 chips, 4 per host
    ("TPU-V5LITEPOD", "4x4", 4),  # v5e is "v5litepod" to Ray; "TPU-V5E" is rejected
    ("TPU-V5P", "2x2x2", 2),      # v5p-16: 8 chips (2 cores each), 4 per host
])
def test_tpu_trainer_config_is_accepted_by_ray(accelerator_type, topology, hosts):
    argv = ["--use-tpu", "--topology", topology, "--accelerator-type", accelerator_type, "--num-workers",
            str(hosts), "--chips-per-host", "4", "--storage-path", "gs://bucket/ray", "--run-name", "r1",
            "--run-id", "r1-x7k2p"]
    trainer = train.make_trainer(train.resolve_config(train.build_parser().parse_args(argv)))
    scaling, run = trainer.scaling_config, trainer.run_config
    assert (scaling.use_tpu, scaling.num_workers, scaling.topology) == (True, hosts, topology)
    assert scaling.resources_per_worker == {"TPU": 4} and scaling.accelerator_type == accelerator_type
    # One Ray Train run directory per writer: gs://bucket/ray/r1/r1-x7k2p.
    assert (run.name, run.storage_path) == ("r1/r1-x7k2p", "gs://bucket/ray")
    assert run.failure_config.max_failures == 2
    assert "JAX_PLATFORMS" not in run.worker_runtime_env.get("env_vars", {})  # JaxTrainer sets "tpu"

    with pytest.raises(ValueError, match="multiple of"):  # Ray checks hosts per slice
        train.make_trainer(train.resolve_config(train.build_parser().parse_args(
            argv[:6] + [str(hosts + 1)] + argv[7:])))


def _catalogue_shapes():
    from infra.tpu import MACHINE_TYPES

    return [(m.name, t) for m in MACHINE_TYPES.values() for t in m.topologies()]


@pytest.mark.parametrize("machine_type, topology", _catalogue_shapes())
def test_every_catalogue_slice_is_a_trainer_ray_accepts_and_reserves(machine_type, topology):
    """Each slice of infra/tpu.py as the RayJob's flags give it (one worker per host, its chips): Ray's ScalingConfig
    takes it, and Ray's slice reservation (SlicePlacementGroup, which JaxTrainer makes on a TPU) knows its topology
    exactly where the catalogue says the training jobs can run there (tpu7x-standard-1t's 1x1x1: not in Ray 2.60)."""
    from ray._private.accelerators.tpu import TPUAcceleratorManager
    from ray.util.tpu import get_tpu_version_from_type

    from infra.tpu import lookup_slice

    tpu = lookup_slice(machine_type, topology)
    argv = ["--use-tpu", "--topology", topology, "--accelerator-type", tpu.generation.ray_accelerator_type,
            "--num-workers", str(tpu.hosts), "--chips-per-host", str(tpu.chips_per_host),
            "--storage-path", "gs://bucket/ray", "--run-name", "r1", "--run-id", "r1-x7k2p"]
    scaling = train.make_trainer(train.resolve_config(train.build_parser().parse_args(argv))).scaling_config
    assert (scaling.num_workers, scaling.resources_per_worker) == (tpu.hosts, {"TPU": tpu.chips_per_host})
    version = get_tpu_version_from_type(tpu.generation.ray_accelerator_type)
    reservable = TPUAcceleratorManager.is_valid_tpu_accelerator_topology(version, topology)
    assert reservable == (tpu.is_multi_host or tpu.machine_type.ray_trains_single_host)


# The file a downwardAPI volume of `metadata.annotations` holds: one `key="value"` line per annotation, keys sorted,
# each value quoted as Go's %q does (kubernetes pkg/fieldpath/fieldpath.go FormatMap).
ANNOTATIONS_FILE = ('kubectl.kubernetes.io/last-applied="{\\"a\\": 1}"\n'
                    'ray.io/ft-enabled="false"\n'
                    'tpu-fallback/checkpoint-request="maintenance-20261201t100000z 2026-12-01T09:40:00Z"\n')


def test_the_checkpoint_request_is_read_from_the_pods_annotations_file(tmp_path):
    path = tmp_path / "annotations"
    assert train.checkpoint_request_id(str(path)) is None  # no volume (a local run): no request
    path.write_text(ANNOTATIONS_FILE)
    assert train.checkpoint_request_id(str(path)) == "maintenance-20261201t100000z"
    path.write_text('ray.io/ft-enabled="false"\n')
    assert train.checkpoint_request_id(str(path)) is None
    path.write_text('tpu-fallback/checkpoint-request=not quoted\n')
    assert train.checkpoint_request_id(str(path)) is None  # unreadable: no request, never a crash


def test_the_hosts_agree_on_requests_in_the_notices_gather(tmp_path):
    """One process (the multi-host gather is the notice's, exercised by tests/test_train_ray.py): the notice and the
    request's number, the same number for the same id on every host, 0 for none."""
    notice, annotations = tmp_path / "notice", tmp_path / "annotations"
    assert train._signals_anywhere(str(notice), str(annotations), 1) == (False, set())
    annotations.write_text(ANNOTATIONS_FILE)
    noticed, requests = train._signals_anywhere(str(notice), str(annotations), 1)
    assert not noticed and requests == {train._request_hash(str(annotations))} and 0 < min(requests) < 2 ** 31
    notice.write_text("")
    assert train._signals_anywhere(str(notice), str(annotations), 1) == (True, requests)
