"""Tests of workloads/train.py: real Ray Train (JaxTrainer) and real JAX on the CPU.

The Ray tests run 2 worker processes joined by jax.distributed (2 processes x 1 CPU device), like two
TPU hosts. Four fit() calls in all (about 2 minutes on 2 cores): an uninterrupted run, a run with a termination
notice and an injected worker death, an extension of the first run, and a second dispatch of the first run's job (another
run id) that resumes from it. The model helpers and the choice of the resume source are unit-tested
in-process.
"""

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TRAIN_PY = Path(__file__).resolve().parents[1] / "workloads" / "train.py"


# Imported as workloads.train here; on the cluster it runs as a single file (see the subprocess test).
from workloads import train  # noqa: E402

STEPS = 30
CKPT_EVERY = 10
FAIL_AT = 15
NOTICE_AT = 5
VOCAB = train.build_parser().parse_args([]).vocab  # the defaults are what `python train.py` runs
LOG_V = math.log(VOCAB)


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


# --------------------------------------------------------------------------------------------------
# Ray Train on the CPU: 2 workers
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cpu(monkeypatch_module):
    import ray
    # Ray starts the workers of a driver's tasks at nice 15, but those of a submitted job (`ray job submit`, how
    # KubeRay runs the job on the cluster) at 0 (ray/dashboard/modules/job/job_manager.py: RAY_worker_niceness).
    # At 15, beside the suite's control planes, the training got a sliver of the CPU: the file took 933 s in a
    # fresh-clone run (172 s alone), the suite's longest pole. 0, as on the cluster.
    monkeypatch_module.setenv("RAY_worker_niceness", "0")
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _argv(root: Path, run: str, steps: int, *extra: str) -> list:
    return ["--storage-path", str(root / "ray"), "--run-name", run, "--checkpoint-dir", str(root / f"{run}-orbax"),
            "--steps", str(steps), "--checkpoint-every", str(CKPT_EVERY), "--report-every", "10",
            "--num-workers", "2", *extra]


def _run_dir(root: Path, run: str, run_id: str | None = None) -> Path:
    """Where a run of job ``run`` writes its orbax steps (default run id: the driver's, "local" here)."""
    run_id = run_id or train.resolve_config(train.build_parser().parse_args([]))["run_id"]
    return Path(train.run_checkpoint_dir(str(root / f"{run}-orbax"), run_id))


def _final_state(root: Path, run: str, step: int, run_id: str | None = None) -> dict:
    cfg = train.model_config(train.resolve_config(train.build_parser().parse_args([])))
    return train.load_checkpoint(str(_run_dir(root, run, run_id)), cfg, step=step)


@pytest.fixture(scope="module")
def baseline(ray_cpu, tmp_path_factory):
    """An uninterrupted run of STEPS steps; its final state is read at once (test_second_fit extends it)."""
    root = tmp_path_factory.mktemp("baseline")
    result = train.main(_argv(root, "base", STEPS))
    return {"root": root, "result": result, "state": _final_state(root, "base", STEPS)}


def test_loss_falls_below_half_of_log_vocab(baseline):
    metrics = baseline["result"].metrics
    assert metrics["step"] == STEPS and metrics["start_step"] == 0 and metrics["devices"] == 2
    assert abs(metrics["first_loss"] - LOG_V) < 0.1  # starts at the uniform guess, log(128) = 4.85
    # Measured on 2 CPU workers: 2.19 nats (0.45 * log V) at step 30; the data's entropy floor is ~1.86
    # (0.38 * log V). Half of log V (2.43) leaves about 10% margin.
    assert metrics["loss"] < 0.5 * LOG_V, metrics
    assert metrics["tokens_per_s"] > 0 and metrics["tflops_per_device"] > 0


def test_a_notice_loses_no_step_a_crash_at_most_one_interval_and_both_match_the_uninterrupted_run(baseline,
                                                                                                   tmp_path):
    """One fit, two faults: GKE's termination notice at step NOTICE_AT (the file the workers' preStop hook creates),
    then a worker killed without notice at FAIL_AT. Ray Train restarts the worker group after each."""
    notice = tmp_path / "notice-dir" / "termination-notice"
    result = train.main(_argv(tmp_path, "crash", STEPS, "--fail-at-step", str(FAIL_AT),
                              "--preempt-at-step", str(NOTICE_AT), "--notice-file", str(notice)))

    assert (tmp_path / "crash-orbax" / f"injected-notice-at-step-{NOTICE_AT}").exists()  # the notice came once
    assert (tmp_path / "crash-orbax" / f"injected-failure-at-step-{FAIL_AT}").exists()  # it did die once
    assert not notice.exists()  # consumed by the run that saw it
    # Each checkpoint's Ray marker says the step and where its worker group began; the markers stay on storage when
    # a report is dropped (a worker that dies before Ray Train's controller collects it), the metrics do not.
    markers = {(meta["step"], meta["start_step"]) for meta in
               (json.loads(p.read_text()) for p in (tmp_path / "ray" / "crash").rglob("meta.json"))}
    # With notice: every host saved the step it reached (off the checkpoint interval), and the next group began
    # there: no finished step lost.
    assert NOTICE_AT % CKPT_EVERY and (NOTICE_AT, 0) in markers and (10, NOTICE_AT) in markers, markers
    # Without notice: the restarted worker group began at the last orbax step before the failure, not at 0 (steps
    # lost: FAIL_AT - 10, at most one interval).
    assert result.metrics["step"] == STEPS
    assert result.metrics["start_step"] == (FAIL_AT // CKPT_EVERY) * CKPT_EVERY == 10
    assert {start for step, start in markers if step > FAIL_AT} == {10}, markers

    # Same seed, same batches per step, deterministic CPU XLA: the state after the restart matches the
    # uninterrupted run's exactly (params, Adam moments, step). Bitwise, hence rtol=atol=0.
    import jax
    crashed = _final_state(tmp_path, "crash", STEPS)
    expected = jax.tree_util.tree_flatten_with_path(baseline["state"])[0]
    got = jax.tree_util.tree_flatten_with_path(crashed)[0]
    assert [p for p, _ in expected] == [p for p, _ in got]
    for (path, want), (_, have) in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=0, atol=0, err_msg=jax.tree_util.keystr(path))


def test_second_fit_with_same_run_name_resumes_instead_of_starting_over(baseline):
    root = baseline["root"]
    result = train.main(_argv(root, "base", STEPS + 10))
    metrics = result.metrics
    assert metrics["start_step"] == baseline["result"].metrics["step"] == STEPS
    assert metrics["step"] == STEPS + 10
    # The first loss of the second fit is that of trained parameters, not of a fresh init (~log V).
    assert metrics["first_loss"] < 0.5 * LOG_V, metrics


def _files(directory: Path) -> dict:
    """{relative path: (size, mtime in ns)} of every file under ``directory``."""
    return {str(f.relative_to(directory)): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in directory.rglob("*") if f.is_file()}


def _steps(run_dir: Path) -> list:
    return sorted(int(p.name) for p in run_dir.iterdir() if p.name.isdigit())


def test_a_second_dispatch_of_the_job_resumes_from_the_first_and_writes_only_its_own_files(baseline):
    """MultiKueue may run one job in two clusters with the same flags; only the run id (the RayCluster's
    name) differs. The baseline's run (the default run id) is dispatch A, finished; dispatch B starts with
    run id "dispatch-b", takes A's newest step and trains on. One after the other, not at once: a fit takes
    both CPUs. Neither run writes into the other's directories."""
    root, job, a_id = baseline["root"], "base", _run_dir(baseline["root"], "base").name
    a_orbax, b_orbax = _run_dir(root, job, a_id), _run_dir(root, job, "dispatch-b")
    a_ray, b_ray = root / "ray" / job / a_id, root / "ray" / job / "dispatch-b"
    a_newest = _steps(a_orbax)[-1]  # STEPS, or STEPS + 10 after test_second_fit
    a_files, a_ray_files = _files(a_orbax), _files(a_ray)
    assert a_newest >= STEPS and a_files and a_ray_files and not b_orbax.exists()

    b = train.main(_argv(root, job, a_newest + CKPT_EVERY, "--run-id", "dispatch-b"))
    assert (b.metrics["start_step"], b.metrics["resumed_from"]) == (a_newest, a_id)
    assert b.metrics["step"] == a_newest + CKPT_EVERY
    # B wrote, changed and deleted nothing of A's (orbax steps, Ray Train run) and saved into its own only.
    assert _files(a_orbax) == a_files and _files(a_ray) == a_ray_files
    assert _steps(b_orbax) == [a_newest + CKPT_EVERY]
    assert sorted(p.name for p in (root / f"{job}-orbax").iterdir()) == ["runs"]  # no step at the root
    assert sorted(p.name for p in a_orbax.parent.iterdir()) == sorted([a_id, "dispatch-b"])
    assert sorted(p.name for p in (root / "ray" / job).iterdir()) == sorted([a_id, "dispatch-b"])
    assert Path(b.path) == b_ray
    markers = [json.loads((Path(ckpt.path) / "meta.json").read_text()) for ckpt, _ in b.best_checkpoints]
    assert markers and {m["orbax_dir"] for m in markers} == {str(b_orbax)}  # Ray's marker names B's steps

    # B started from A's newest parameters: its first loss is theirs on the batch of step a_newest (both
    # processes' slices, in process order). A fresh start would show ~log V, an older step another value.
    config = train.resolve_config(train.build_parser().parse_args([]))
    cfg, local_batch = train.model_config(config), config["batch_size"] // 2
    params = train.load_checkpoint(str(a_orbax), cfg, step=a_newest)["params"]
    batch = np.concatenate([train.synthetic_batch(config["seed"], a_newest, proc, local_batch, cfg.seq_len,
                                                  cfg.vocab) for proc in (0, 1)])
    assert b.metrics["first_loss"] == pytest.approx(float(train.loss_fn(params, batch, cfg)), rel=1e-5, abs=0)
