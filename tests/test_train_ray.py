"""workloads/train.py with real Ray Train (JaxTrainer) and real JAX on the CPU: 2 worker processes joined by
jax.distributed (2 processes x 1 CPU device), like two TPU hosts. Four fit() calls, each ~25 s alone on 2 cores
with JAX's persistent compilation cache shared by the worker groups: an uninterrupted run, a run with a termination
notice and an injected worker death, a second dispatch of the first run's job (another run id) that resumes from
it, and a short run through a maintenance asked ahead (70 s on its own under load). A rerun with the same run id
(`python train.py` twice, locally) resumes through the branch the faulted run's restarts take (its own run's newest
step), so it has no fit of its own: each fit costs ~50 s in the loaded suite.
"""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from workloads import train

STEPS = 30
CKPT_EVERY = 10
FAIL_AT = 15
NOTICE_AT = 5
REQUEST_AT = 25  # the failover controller's checkpoint request, in the worker group that restarted after FAIL_AT
VOCAB = train.build_parser().parse_args([]).vocab  # the defaults are what `python train.py` runs
LOG_V = math.log(VOCAB)

# --------------------------------------------------------------------------------------------------
# Ray Train on the CPU: 2 workers
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cpu(monkeypatch_module, tmp_path_factory):
    import ray
    # Every worker group compiles the same train step (each fit, each restart after a fault: 7 groups of 2 here).
    # JAX's persistent compilation cache (supported on the CPU backend) lets all but the first load it from disk; the
    # workers inherit the variables from this process through ray.init. Ref:
    # https://docs.jax.dev/en/latest/persistent_compilation_cache.html
    monkeypatch_module.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax-cache")))
    monkeypatch_module.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch_module.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    # One XLA thread per worker: each worker is one "host" with one CPU device, two share the machine's 2 cores,
    # and XLA's multi-threaded Eigen pool only spun beside them (measured, one fit: 59 -> 53 CPU-s of Ray's
    # processes idle, 62 -> 56 beside two busy loops). Ref: https://github.com/jax-ml/jax/issues/743
    monkeypatch_module.setenv("XLA_FLAGS", " ".join(filter(None, (
        os.environ.get("XLA_FLAGS"), "--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1"))))
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


def _goodput(root: Path, run: str, run_id: str | None = None) -> tuple[dict, list]:
    """A run's goodput result (runs/<run-id>/goodput/result.json) and its records, oldest first (payloads)."""
    orbax, run_dir = str(root / f"{run}-orbax"), _run_dir(root, run, run_id)
    records = train.GoodputFileLogger(orbax, train.goodput_job_name(run, orbax), run_dir.name).records()
    result = json.loads((run_dir / train.GOODPUT_DIR / train.GOODPUT_RESULT).read_text())
    return result, [r["payload"] for r in records]


def _job_goodput(root: Path, run: str) -> tuple[dict, list]:
    """The job's goodput, derived now from every run's records, and those records, oldest first (payloads)."""
    config = train.resolve_config(train.build_parser().parse_args(_argv(root, run, STEPS)))
    records = train.goodput_logger(config, every_run=True).records()
    return train.job_goodput(config), [r["payload"] for r in records]


def _step_starts(records: list) -> list:
    return [r["step_count"] for r in records if "step_start_time" in r]


# The library's badput kinds (ml_goodput_measurement 0.2.3 BadputType, lower case), as the result names them.
BADPUT_KEYS = {"tpu_initialization", "training_prep", "program_startup", "data_loading_sync", "data_loading_async",
               "unproductive_checkpoint_save_time", "unproductive_checkpoint_restore_time",
               "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption", "custom_badput_events",
               "other"}


def _assert_run_goodput(result: dict) -> None:
    """A run's own result: over its records only, written when its fit() ended."""
    assert result["scope"] == "run" and result["finished"], result
    _assert_goodput_shape(result)


def _assert_goodput_shape(result: dict) -> None:
    assert 0 < result["goodput"] <= 1 and result["records"] == "file", result
    assert set(result["badput"]) == set(result["seconds"]["badput"]) == BADPUT_KEYS, result
    assert result["max_productive_step"] >= STEPS and result["seconds"]["job"] > result["seconds"]["productive"] > 0
    # Orbax's save events and the wait for its commit reached the records: every run here saves.
    assert result["seconds"]["badput"]["unproductive_checkpoint_save_time"] > 0, result
    assert result["seconds"]["badput"]["custom_badput_events"][train.CHECKPOINT_SAVE_WAIT] > 0, result
    # Nothing counted twice: goodput and the kinds of badput (async data loading overlaps training) make the whole.
    parts = [v for k, v in result["badput"].items() if k not in ("custom_badput_events", "data_loading_async")]
    assert result["goodput"] + sum(parts) + sum(result["badput"]["custom_badput_events"].values()) == pytest.approx(1)


def _final_state(root: Path, run: str, step: int, run_id: str | None = None) -> dict:
    cfg = train.model_config(train.resolve_config(train.build_parser().parse_args([])))
    return train.load_checkpoint(str(_run_dir(root, run, run_id)), cfg, step=step)


@pytest.fixture(scope="module")
def baseline(ray_cpu, tmp_path_factory):
    """An uninterrupted run of STEPS steps; its final state is read at once (the second dispatch extends it)."""
    root = tmp_path_factory.mktemp("baseline")
    result = train.main(_argv(root, "base", STEPS))
    return {"root": root, "result": result, "state": _final_state(root, "base", STEPS),
            "goodput": _goodput(root, "base")}  # its own result and records


def test_loss_falls_below_half_of_log_vocab(baseline):
    metrics = baseline["result"].metrics
    assert metrics["step"] == STEPS and metrics["start_step"] == 0 and metrics["devices"] == 2
    assert abs(metrics["first_loss"] - LOG_V) < 0.1  # starts at the uniform guess, log(128) = 4.85
    # Measured on 2 CPU workers: 2.19 nats (0.45 * log V) at step 30; the data's entropy floor is ~1.86
    # (0.38 * log V). Half of log V (2.43) leaves about 10% margin.
    assert metrics["loss"] < 0.5 * LOG_V, metrics
    assert metrics["tokens_per_s"] > 0 and metrics["tflops_per_device"] > 0


def test_an_uninterrupted_runs_goodput_is_written_in_its_own_directory(baseline):
    result, records = baseline["goodput"]
    _assert_run_goodput(result)
    assert result["disruptions"] == 0 and _step_starts(records) == list(range(STEPS + 1))  # + "progress kept"
    badput = result["seconds"]["badput"]
    assert badput["wasted_progress_from_disruption"] == badput["infrastructure_recovery_from_disruption"] == 0
    assert badput["unproductive_checkpoint_restore_time"] == 0  # a fresh start restores nothing


def test_a_notice_loses_no_step_a_crash_at_most_one_interval_and_both_match_the_uninterrupted_run(baseline,
                                                                                                   tmp_path):
    """One fit, two faults: GKE's termination notice at step NOTICE_AT (the file the workers' preStop hook creates),
    then a worker killed without notice at FAIL_AT. Ray Train restarts the worker group after each. And a checkpoint
    request at REQUEST_AT (the pods' annotations file): a save off the interval, and training goes on."""
    notice = tmp_path / "notice-dir" / "termination-notice"
    annotations = tmp_path / "podinfo" / "annotations"
    result = train.main(_argv(tmp_path, "crash", STEPS, "--fail-at-step", str(FAIL_AT),
                              "--preempt-at-step", str(NOTICE_AT), "--notice-file", str(notice),
                              "--request-at-step", str(REQUEST_AT), "--pod-annotations-file", str(annotations)))

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
    # The checkpoint request: every host saved the step it reached (off the interval), and the same group trained on.
    assert REQUEST_AT % CKPT_EVERY and (REQUEST_AT, 10) in markers and (STEPS, 10) in markers, markers
    assert REQUEST_AT in _steps(_run_dir(tmp_path, "crash"))

    # Same seed, same batches per step, deterministic CPU XLA: the state after the restart matches the
    # uninterrupted run's exactly (params, Adam moments, step). Bitwise, hence rtol=atol=0.
    import jax
    crashed = _final_state(tmp_path, "crash", STEPS)
    expected = jax.tree_util.tree_flatten_with_path(baseline["state"])[0]
    got = jax.tree_util.tree_flatten_with_path(crashed)[0]
    assert [p for p, _ in expected] == [p for p, _ in got]
    for (path, want), (_, have) in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=0, atol=0, err_msg=jax.tree_util.keystr(path))

    # Goodput over the three worker groups' records, which outlived the groups that wrote them: each group's steps, the
    # first two ending in the step the next began at (the notice's "progress kept" at NOTICE_AT; FAIL_AT - 1, the last
    # step begun before the death, after 10), so the library counts two disruptions, the steps lost and the recovery.
    goodput, records = _goodput(tmp_path, "crash")
    _assert_run_goodput(goodput)
    assert _step_starts(records) == [*range(NOTICE_AT + 1), *range(NOTICE_AT, FAIL_AT), *range(10, STEPS + 1)]
    assert sum("job_start_time" in r for r in records) == 1 + 3  # the driver's, and each worker group's
    assert goodput["disruptions"] == 2, goodput
    badput = goodput["seconds"]["badput"]
    assert badput["wasted_progress_from_disruption"] > 0 and badput["infrastructure_recovery_from_disruption"] > 0
    assert badput["unproductive_checkpoint_restore_time"] > 0, goodput


def _files(directory: Path) -> dict:
    """{relative path: (size, mtime in ns)} of every file under ``directory``."""
    return {str(f.relative_to(directory)): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in directory.rglob("*") if f.is_file()}


def _written(before: dict, after: dict) -> list:
    """The paths a run created, changed or deleted, given ``_files`` of one directory before and after it."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def _outside(paths, *own_dirs: str) -> list:
    """The paths that are in none of a run's own directories."""
    return [p for p in paths if not any(p.startswith(f"{d}/") for d in own_dirs)]


def _steps(run_dir: Path) -> list:
    return sorted(int(p.name) for p in run_dir.iterdir() if p.name.isdigit())


def test_a_second_dispatch_of_the_job_resumes_from_the_first_and_writes_only_its_own_files(baseline):
    """MultiKueue may run one job in two clusters with the same flags; only the run id (the RayCluster's
    name) differs. The baseline's run (the default run id) is dispatch A, finished; dispatch B starts with
    run id "dispatch-b", takes A's newest step and trains on. One after the other, not at once: a fit takes
    both CPUs. Every path each run wrote (checkpoints, goodput records and result, Ray Train run) is in its own
    directories, and no path is written by both."""
    root, job, a_id = baseline["root"], "base", _run_dir(baseline["root"], "base").name
    a_orbax, b_orbax = _run_dir(root, job, a_id), _run_dir(root, job, "dispatch-b")
    a_ray, b_ray = root / "ray" / job / a_id, root / "ray" / job / "dispatch-b"
    a_own = (str(a_orbax.relative_to(root)), str(a_ray.relative_to(root)))
    b_own = (str(b_orbax.relative_to(root)), str(b_ray.relative_to(root)))
    a_newest = _steps(a_orbax)[-1]
    a_wrote = _files(root)  # A is all that ran under root
    assert a_newest == STEPS and not b_orbax.exists()
    assert f"{a_own[0]}/goodput/records.jsonl" in a_wrote and f"{a_own[0]}/goodput/result.json" in a_wrote
    assert any(p.startswith(f"{a_own[1]}/") for p in a_wrote) and _outside(a_wrote, *a_own) == []

    b = train.main(_argv(root, job, a_newest + CKPT_EVERY, "--run-id", "dispatch-b"))
    assert (b.metrics["start_step"], b.metrics["resumed_from"]) == (a_newest, a_id)
    assert b.metrics["step"] == a_newest + CKPT_EVERY
    # B created, changed and deleted nothing outside its own directories, so nothing of A's (orbax steps, goodput
    # records and result, Ray Train run): no path written by both.
    b_wrote = _written(a_wrote, _files(root))
    assert f"{b_own[0]}/goodput/records.jsonl" in b_wrote and f"{b_own[0]}/goodput/result.json" in b_wrote
    assert _outside(b_wrote, *b_own) == [] and not set(b_wrote) & set(a_wrote)
    # B's own goodput: its fit alone, from A's last step on.
    own, records = _goodput(root, job, "dispatch-b")
    _assert_run_goodput(own)
    assert (own["run"], own["disruptions"], own["max_productive_step"]) == ("dispatch-b", 0, a_newest + CKPT_EVERY)
    assert _step_starts(records) == list(range(a_newest, a_newest + CKPT_EVERY + 1))
    assert own["seconds"]["badput"]["unproductive_checkpoint_restore_time"] > 0, own
    # The job's goodput, derived from both runs' records when read: B began at A's last step, one disruption.
    goodput, records = _job_goodput(root, job)
    _assert_goodput_shape(goodput)
    assert (goodput["runs"], goodput["overlapping"]) == (sorted([a_id, "dispatch-b"]), [])
    assert goodput["disruptions"] == 1 and goodput["max_productive_step"] == a_newest + CKPT_EVERY
    assert _step_starts(records) == [*range(a_newest + 1), *range(a_newest, a_newest + CKPT_EVERY + 1)]
    assert _steps(b_orbax) == [a_newest + CKPT_EVERY]
    # Nothing at the root but the runs.
    assert sorted(p.name for p in (root / f"{job}-orbax").iterdir()) == ["runs"]
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


MAINTENANCE_STEPS, LEAD_AT, WINDOW_AT = 12, 6, 8  # the request LEAD_AT, the window at WINDOW_AT: both off the interval


def test_a_maintenance_asked_ahead_loses_no_finished_step(ray_cpu, tmp_path):
    """A host maintenance as the failover controller and GKE play it: the checkpoint request the lead time before
    the window, in the pods' annotations file (the downwardAPI volume, replaced whole as the kubelet does); the job
    saves and trains on. At the window GKE terminates the pods (the preStop hook's notice, then the kill at the end of
    the pods' part): every host saves the step it reached and exits, and the restarted worker group resumes at the
    last step finished before the kill. The request is still in the file it starts with: taken as honoured, no save."""
    from failover.api import CHECKPOINT_REQUEST_ANNOTATION, CheckpointRequest

    notice, annotations = tmp_path / "notice-dir" / "termination-notice", tmp_path / "podinfo" / "annotations"
    result = train.main(_argv(tmp_path, "maint", MAINTENANCE_STEPS, "--request-at-step", str(LEAD_AT),
                              "--pod-annotations-file", str(annotations), "--preempt-at-step", str(WINDOW_AT),
                              "--notice-file", str(notice)))
    # What the pods' file held is a request as the controller writes it (failover/api/checkpoints.py).
    key, _, quoted = annotations.read_text().strip().partition("=")
    assert key == CHECKPOINT_REQUEST_ANNOTATION and CheckpointRequest.parse(json.loads(quoted)) is not None
    assert (tmp_path / "maint-orbax" / f"injected-notice-at-step-{WINDOW_AT}").exists() and not notice.exists()
    markers = {(meta["step"], meta["start_step"]) for meta in
               (json.loads(p.read_text()) for p in (tmp_path / "ray" / "maint").rglob("meta.json"))}
    assert LEAD_AT % CKPT_EVERY and WINDOW_AT % CKPT_EVERY
    # The first group: the request's save, then the window's; nothing else before the kill.
    assert {step for step, start in markers if start == 0} == {LEAD_AT, WINDOW_AT}, markers
    # The next group began at the window's step, the last finished before the kill: no finished step lost; it saved
    # on the interval and at the end only.
    assert {(step, start) for step, start in markers if start != 0} == {(10, WINDOW_AT),
                                                                         (MAINTENANCE_STEPS, WINDOW_AT)}, markers
    assert (result.metrics["step"], result.metrics["start_step"]) == (MAINTENANCE_STEPS, WINDOW_AT)
