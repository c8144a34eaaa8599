"""Goodput in workloads/train.py without Ray: the file-backed logger that stands in for Cloud Logging, and the result
that the library's calculator makes of scripted records (backfilled times, so every number is known). The records of a
real training, with its restarts, are checked in test_train_ray.py.
"""

import dataclasses
import datetime
import json
import tempfile

import pytest
from etils import epath
from ml_goodput_measurement import goodput
from orbax.checkpoint.logging import step_statistics

from workloads import train

T0 = 1_700_000_000.0
# What the library's breakdown holds (ml_goodput_measurement 0.2.3, GoodputCalculator._get_job_badput_breakdown),
# by BadputType name in lower case; the elastic kinds are only for elastic jobs.
BADPUT_KEYS = {"tpu_initialization", "training_prep", "program_startup", "data_loading_sync", "data_loading_async",
               "unproductive_checkpoint_save_time", "unproductive_checkpoint_restore_time",
               "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption", "custom_badput_events",
               "other"}
FLAT = BADPUT_KEYS - {"custom_badput_events", "data_loading_async"}  # async data loading overlaps training


def at(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(T0 + seconds, datetime.timezone.utc)


def config(root, run_id="a", logger="file") -> dict:
    return {"goodput_logger": logger, "checkpoint_dir": str(root / "orbax"), "run_name": "job", "run_id": run_id}


def steps(recorder, starts: dict) -> None:
    for step, second in starts.items():
        recorder.record_step_start_time(step, at(second))


def save_event(step: int, blocking: float) -> dict:
    """What orbax's CheckpointManager.save logs (its own dataclass), with the blocking part lasting ``blocking``."""
    return dataclasses.asdict(step_statistics.SaveStepStatistics(
        step=step, directory="/ckpt", checkpoint_manager_blocking_duration_secs=blocking,
        checkpointer_blocking_duration_secs=blocking, wait_for_prev_duration_secs=0.0,
        get_old_steps_duration_secs=0.0))


def restore_event(step: int, duration: float) -> dict:
    return dataclasses.asdict(step_statistics.RestoreStepStatistics(
        step=step, directory="/ckpt", checkpointer_duration_secs=duration, checkpoint_manager_duration_secs=duration))


def total(result: dict) -> float:
    return result["goodput"] + sum(result["badput"][k] for k in FLAT) + sum(
        result["badput"]["custom_badput_events"].values())


def records_file(root, run_id: str):
    return root / "orbax" / "runs" / run_id / "goodput" / "records.jsonl"


def test_file_logger_keeps_each_runs_records_in_its_own_directory_and_reads_its_own_or_the_jobs(tmp_path):
    orbax = str(tmp_path / "orbax")
    a = train.GoodputFileLogger(orbax, "job-1", "a")
    b = train.GoodputFileLogger(orbax, "job-1", "b")
    a.write_cloud_logging_entry({"job_name": "job-1", "job_start_time": T0})
    b.write_cloud_logging_entry({"job_name": "job-1", "step_count": 0, "step_start_time": T0 + 1})
    a.write_cloud_logging_entry({"job_name": "another-job", "job_start_time": T0})  # not this job's: dropped
    a.write_cloud_logging_entry(None)
    a.log_entry(restore_event(10, 0.5))  # orbax's interface: tagged with the job, as orbax's CloudLogger does
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "orbax/runs/a/goodput/records.jsonl", "orbax/runs/b/goodput/records.jsonl"]
    assert len(records_file(tmp_path, "a").read_text().splitlines()) == 2
    # A run reads its own records: a restarted worker group of it reads what the one before wrote.
    assert [sorted(p) for p in train.GoodputFileLogger(orbax, "job-1", "b").read_cloud_logging_entries()[0]] == [
        ["job_name", "step_count", "step_start_time"]]

    # Every run's, oldest first: the job's records as Cloud Logging would hold them (any run id reads the same).
    job = train.GoodputFileLogger(orbax, "job-1", "c", every_run=True)
    payloads, (last_time, last_id) = job.read_cloud_logging_entries()
    assert [sorted(p) for p in payloads] == [["job_name", "job_start_time"], ["job_name", "step_count", "step_start_time"],
                                            sorted(["job_name", *restore_event(10, 0.5)])]
    assert payloads[2]["job_name"] == "job-1" and payloads[2]["checkpoint_manager_duration_secs"] == 0.5
    # The library's incremental query: after the last entry seen, nothing new; an end before every entry, nothing.
    assert a.read_cloud_logging_entries(last_time, None, (last_time, last_id))[0] == []
    first = json.loads(records_file(tmp_path, "a").read_text().splitlines()[0])
    before = datetime.datetime.fromtimestamp(first["timestamp"] - 1, datetime.timezone.utc)
    assert a.read_cloud_logging_entries(end_time=before) == ([], (None, None))
    assert train.GoodputFileLogger(str(tmp_path / "none"), "job-1").read_cloud_logging_entries() == ([], (None, None))
    assert train.GoodputFileLogger(str(tmp_path / "none"), "job-1", every_run=True).records() == []


def test_job_name_is_the_run_name_and_the_checkpoint_roots_hash_path_safe():
    name = train.goodput_job_name("rayjob-tpu-v6e-4x4-1", "gs://bucket-a/rayjob-tpu-v6e-4x4-1/orbax")
    assert name.startswith("rayjob-tpu-v6e-4x4-1-") and len(name) == len("rayjob-tpu-v6e-4x4-1-") + 8
    assert name == train.goodput_job_name("rayjob-tpu-v6e-4x4-1", "gs://bucket-a/rayjob-tpu-v6e-4x4-1/orbax/")
    assert name != train.goodput_job_name("rayjob-tpu-v6e-4x4-1", "gs://bucket-b/rayjob-tpu-v6e-4x4-1/orbax")
    assert train.goodput_job_name("a/b c", "/x").startswith("a-b-c-")


def test_records_go_to_a_file_beside_the_checkpoints_wherever_they_are_unless_cloud_logging_is_asked_for(monkeypatch):
    monkeypatch.delenv("RAY_CLUSTER_NAME", raising=False)
    parse = lambda *argv: train.resolve_config(train.build_parser().parse_args(list(argv)))  # noqa: E731
    assert parse("--storage-path", "gs://bucket/ray")["goodput_logger"] == "file"
    assert parse("--storage-path", "/tmp/x")["goodput_logger"] == "file"
    assert parse("--storage-path", "gs://b/ray", "--goodput-logger", "file")["goodput_logger"] == "file"
    assert parse("--storage-path", "gs://b/ray", "--goodput-logger", "cloud")["goodput_logger"] == "cloud"
    assert parse("--storage-path", "gs://b/ray", "--goodput-logger", "off")["goodput_logger"] == "off"


GS_ORBAX = "gs://bucket/job/orbax"


def gs_config(run_id="a") -> dict:
    return {"goodput_logger": "file", "checkpoint_dir": GS_ORBAX, "run_name": "job", "run_id": run_id}


@pytest.fixture
def object_storage(monkeypatch, tmp_path):
    """gs:// without a network: fsspec's in-memory file system behind epath's gs:// backend (the layer orbax and
    train._write_whole use), and each pod's local disk a directory of tmp_path. Returns (the objects, pod(name)): pod
    makes the code that follows run "in" that pod (its temporary directory, where the records' spool is)."""
    from etils.epath import backend
    from fsspec.implementations.memory import MemoryFileSystem
    memory = MemoryFileSystem(skip_instance_cache=True)
    memory.store, memory.pseudo_dirs = {}, [""]  # its own objects, not the class-wide store
    monkeypatch.setattr(backend.fsspec_backend, "fs", lambda path: memory)

    def pod(name: str) -> None:
        (tmp_path / name).mkdir(exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / name))
    return memory.store, pod


def uploaded(run_id="a") -> list:
    """The payloads in run ``run_id``'s records object, in order."""
    text = epath.Path(f"{GS_ORBAX}/runs/{run_id}/goodput/records.jsonl").read_text()
    return [json.loads(line)["payload"] for line in text.splitlines()]


def test_records_in_object_storage_collect_in_the_pod_and_are_written_whole_at_each_flush(object_storage):
    """The run's writers take turns, each in its own pod: the driver (the job's start), then a worker group's rank 0,
    which writes the object at its checkpoint save; its pod dies before the next save; a group restarted elsewhere
    ends the run."""
    objects, pod = object_storage
    pod("head")
    driver = train.goodput_recorder(gs_config(), enabled=True)
    driver.record_job_start_time(at(0))
    driver.flush()  # train.main, before fit()
    pod("worker-1")
    rank0 = train.goodput_recorder(gs_config(), enabled=True)
    steps(rank0, {0: 1, 1: 2})
    train.checkpoint_event_logger(gs_config(), enabled=True).log_entry(save_event(2, blocking=0.25))
    assert [sorted(p) for p in uploaded()] == [["job_name", "job_start_time"]]  # the worker's lines: in its pod yet
    rank0.flush()  # after the save (train_loop_per_worker)
    assert [p.get("step_count", p.get("step")) for p in uploaded()] == [None, 0, 1, 2]
    steps(rank0, {2: 3})  # then the pod dies without notice: this line is lost with it, as step 2's progress is

    pod("worker-2")  # the restarted group, in another pod, adds its lines to what is there
    again = train.goodput_recorder(gs_config(), enabled=True)
    steps(again, {2: 5})
    again.record_job_end_time(at(6))
    again.flush()
    assert [(p.get("step_count"), "job_end_time" in p) for p in uploaded()] == [
        (None, False), (0, False), (1, False), (None, False), (2, False), (None, True)]
    assert uploaded()[3]["step"] == 2  # orbax's save event
    assert sorted(objects) == [f"{GS_ORBAX}/runs/a/goodput/records.jsonl"]


def test_a_runs_result_and_the_jobs_view_read_the_records_in_object_storage(object_storage):
    """Run "a": steps 0-2 start at 1, 2 and 3 s, job end at 3 s; the driver computes its result from the object."""
    objects, pod = object_storage
    pod("worker")
    recorder = train.goodput_recorder(gs_config(), enabled=True)
    recorder.record_job_start_time(at(0))
    steps(recorder, {0: 1, 1: 2, 2: 3})
    recorder.record_job_end_time(at(3))
    recorder.flush()

    pod("head")
    result = train.write_goodput_result(gs_config(), finished=True)
    assert sorted(objects) == [f"{GS_ORBAX}/runs/a/goodput/records.jsonl", f"{GS_ORBAX}/runs/a/goodput/result.json"]
    assert json.loads(epath.Path(f"{GS_ORBAX}/runs/a/goodput/result.json").read_text()) == result
    assert (result["run"], result["scope"], result["max_productive_step"]) == ("a", "run", 2)
    assert result["seconds"]["job"] == pytest.approx(3) and result["seconds"]["productive"] == pytest.approx(2)
    job = train.job_goodput(gs_config("b"))  # any run id reads the job's
    assert (job["runs"], job["overlapping"], job["goodput"]) == (["a"], [], pytest.approx(2 / 3))


def test_one_uninterrupted_run_goodput_and_badput_by_cause(tmp_path):
    """0-1 s TPU init, 1-2 s preparation, step 0 from 2 s (2 s with the compile), steps 1-3 one second each, the
    checkpoint after step 3: orbax blocks 0.25 s and the commit wait takes 0.25 s more; progress kept at 7 s, job end."""
    cfg = config(tmp_path)
    recorder = train.goodput_recorder(cfg, enabled=True)
    recorder.record_job_start_time(at(0))
    recorder.record_tpu_init_start_time(at(0))
    recorder.record_tpu_init_end_time(at(1))
    recorder.record_training_preparation_start_time(at(1))
    recorder.record_training_preparation_end_time(at(2))
    steps(recorder, {0: 2, 1: 4, 2: 5, 3: 6})
    train.checkpoint_event_logger(cfg, enabled=True).log_entry(save_event(4, blocking=0.25))
    recorder.record_custom_badput_event_start_time(at(6.5), train.CHECKPOINT_SAVE_WAIT)
    recorder.record_custom_badput_event_end_time(at(6.75), train.CHECKPOINT_SAVE_WAIT)
    steps(recorder, {4: 7})  # train._record_progress_kept
    recorder.record_job_end_time(at(7))

    result = train.write_goodput_result(cfg, finished=True)
    assert json.loads((tmp_path / "orbax" / "runs" / "a" / "goodput" / "result.json").read_text()) == result
    assert (result["run"], result["scope"]) == ("a", "run")
    assert set(result["badput"]) == BADPUT_KEYS
    # Steps 1-3 take 1, 1 and 0.75 s (the commit wait is the save's); their mean, 11/12 s, is what step 0 costs
    # without the start-up; orbax's blocking 0.25 s is the save's too.
    startup = 2 - 2.75 / 3
    productive = 2 + 2.75 - startup - 0.25
    assert result["goodput"] == pytest.approx(productive / 7)
    seconds = result["seconds"]
    assert seconds["job"] == pytest.approx(7) and seconds["productive"] == pytest.approx(productive)
    assert seconds["badput"]["program_startup"] == pytest.approx(startup)
    assert seconds["badput"]["tpu_initialization"] == pytest.approx(1)
    assert seconds["badput"]["training_prep"] == pytest.approx(1)
    assert seconds["badput"]["unproductive_checkpoint_save_time"] == pytest.approx(0.25)
    assert seconds["badput"]["custom_badput_events"] == {train.CHECKPOINT_SAVE_WAIT: pytest.approx(0.25)}
    assert result["badput"]["unproductive_checkpoint_save_time"] == pytest.approx(0.25 / 7)
    assert result["badput"]["wasted_progress_from_disruption"] == 0
    assert result["badput"]["other"] == pytest.approx(0, abs=1e-9)
    assert total(result) == pytest.approx(1)
    assert (result["disruptions"], result["max_productive_step"], result["finished"]) == (0, 4, True)
    assert (result["records"], result["job"]) == ("file", train.goodput_job_name("job", cfg["checkpoint_dir"]))


def result_file(root, run_id: str):
    return root / "orbax" / "runs" / run_id / "goodput" / "result.json"


def test_each_run_writes_its_own_result_and_the_jobs_goodput_spans_them_when_read(tmp_path):
    """Run "a" starts at 0 s, steps 0-3 start at 1, 3, 4 and 5 s, and dies without notice: its newest checkpoint holds
    steps 0-1. Run "b" (another process, another directory) starts at 10 s, restores 0.5 s, starts again at step 2 at
    12 s, and ends after step 3."""
    a = train.goodput_recorder(config(tmp_path, "a"), enabled=True)
    a.record_job_start_time(at(0))
    steps(a, {0: 1, 1: 3, 2: 4, 3: 5})
    early = train.write_goodput_result(config(tmp_path, "a"), finished=False)  # a's driver, after its fit failed
    assert (early["finished"], early["disruptions"], early["max_productive_step"]) == (False, 0, 2)
    a_result = result_file(tmp_path, "a").read_text()
    b_config = config(tmp_path, "b")
    b = train.goodput_recorder(b_config, enabled=True)
    b.record_job_start_time(at(10))
    train.checkpoint_event_logger(b_config, enabled=True).log_entry(restore_event(2, 0.5))
    steps(b, {2: 12, 3: 13, 4: 14})
    b.record_job_end_time(at(14))

    # b's result is b's alone (10-14 s: steps 2 and 3, the restore, 1.5 s of nothing recorded); a's stays a's.
    own = train.write_goodput_result(b_config, finished=True)
    assert json.loads(result_file(tmp_path, "b").read_text()) == own
    assert result_file(tmp_path, "a").read_text() == a_result
    assert (own["run"], own["scope"], own["disruptions"]) == ("b", "run", 0)
    assert own["seconds"]["job"] == pytest.approx(4) and own["goodput"] == pytest.approx(2 / 4)
    assert own["seconds"]["badput"]["unproductive_checkpoint_restore_time"] == pytest.approx(0.5)

    # The job's, derived now from both runs' records and written nowhere: one timeline, b a restart of a.
    before = sorted(tmp_path.rglob("*"))
    result = train.job_goodput(b_config)
    assert sorted(tmp_path.rglob("*")) == before
    assert (result["runs"], result["overlapping"]) == (["a", "b"], [])
    seconds = result["seconds"]["badput"]
    assert result["disruptions"] == 1
    # Run a: step 0 (2 s; 1 s start-up beyond step 1's second) and step 1 kept; step 2 lost. Run b: steps 2 and 3.
    assert result["seconds"]["productive"] == pytest.approx(2 + 2)
    assert seconds["wasted_progress_from_disruption"] == pytest.approx(1)
    assert seconds["program_startup"] == pytest.approx(1)
    # From the last step that a began (3, at 5 s) to b's start.
    assert seconds["infrastructure_recovery_from_disruption"] == pytest.approx(5)
    assert seconds["unproductive_checkpoint_restore_time"] == pytest.approx(0.5)
    # 0-1 s before a's first step and 10-12 s before b's, less the restore: no cause recorded.
    assert seconds["other"] == pytest.approx(1 + 2 - 0.5)
    assert result["goodput"] == pytest.approx(4 / 14) and total(result) == pytest.approx(1)
    # The same through the command line: the job's flags and --goodput-report.
    argv = ["--run-name", "job", "--checkpoint-dir", str(tmp_path / "orbax"), "--goodput-logger", "file"]
    assert {k: v for k, v in train.main([*argv, "--goodput-report"]).items() if k != "computed_at"} == {
        k: v for k, v in result.items() if k != "computed_at"}


def test_runs_at_once_are_named_in_the_jobs_view_each_with_its_own_account(tmp_path):
    """A fleet partition: run "b" starts at 2 s while "a" trains on; both go to step 4. The library reads one timeline,
    so the job's view names the overlap; each run's own result is its own uninterrupted account."""
    a, b = (train.goodput_recorder(config(tmp_path, run), enabled=True) for run in "ab")
    # Written in the order of their times, as live runs write them (the records are ordered by when they were written).
    a.record_job_start_time(at(0))
    steps(a, {0: 1, 1: 2})
    b.record_job_start_time(at(2))
    steps(a, {2: 3})
    steps(b, {2: 3.5})
    steps(a, {3: 4})
    steps(b, {3: 4.5})
    steps(a, {4: 5})
    a.record_job_end_time(at(5))
    steps(b, {4: 5.5})
    b.record_job_end_time(at(6.5))

    job = train.job_goodput(config(tmp_path, "a"))
    # b's steps 2, 3 and 4 each begin again a step a began: the library reads three disruptions where there were none.
    assert (job["overlapping"], job["disruptions"]) == ([["a", "b"]], 3)
    for run, (job_time, productive) in {"a": (5, 4), "b": (4.5, 3)}.items():
        own = train.write_goodput_result(config(tmp_path, run), finished=True)
        assert (own["run"], own["disruptions"]) == (run, 0)
        assert own["seconds"]["job"] == pytest.approx(job_time)
        assert own["seconds"]["productive"] == pytest.approx(productive)
    # Runs that only touch (one ends as the other starts) do not overlap.
    assert train.overlapping_runs({"a": (0, 5), "b": (5, 6), "c": (1, 2)}) == [["a", "c"]]


def test_no_records_no_result_and_off_records_nothing(tmp_path, capsys):
    cfg = config(tmp_path)
    assert train.write_goodput_result(cfg, finished=False) is None  # the library: "Total job time is zero"
    assert "[goodput] not written: ValueError" in capsys.readouterr().out
    assert not (tmp_path / "orbax").exists()

    off = config(tmp_path, logger="off")
    train.goodput_recorder(off, enabled=True).record_job_start_time(at(0))
    assert train.checkpoint_event_logger(off, enabled=True) is None
    assert train.write_goodput_result(off, finished=True) is None
    assert not (tmp_path / "orbax").exists()
    # Ranks other than 0 record nothing either, with any logger.
    train.goodput_recorder(cfg, enabled=False).record_job_start_time(at(0))
    assert train.checkpoint_event_logger(cfg, enabled=False) is None
    assert not (tmp_path / "orbax").exists()


def test_cloud_records_use_the_librarys_cloud_logger_and_orbaxs(monkeypatch, tmp_path):
    """On GKE nothing of ours stands in: the library creates its Cloud Logging logger, orbax its CloudLogger, both on the
    same log and job (stubbed: no credentials here)."""
    import orbax.checkpoint as ocp
    created, written = {}, []

    class FakeCloudLogger:
        def __init__(self, job_name, log_name, **kwargs):
            created["recorder"] = (job_name, log_name)

        def write_cloud_logging_entry(self, entry):
            written.append(entry)

    class FakeOrbaxLogger:
        def __init__(self, options):
            created["orbax"] = (options.job_name, options.logger_name)

        def log_entry(self, entry):
            written.append(entry)

    monkeypatch.setattr(goodput, "_CloudLogger", FakeCloudLogger)
    monkeypatch.setattr(ocp.logging, "CloudLogger", FakeOrbaxLogger)
    cfg = config(tmp_path, logger="cloud") | {"checkpoint_dir": "gs://bucket/job/orbax"}
    assert train.goodput_logger(cfg) is None
    train.goodput_recorder(cfg, enabled=True).record_job_start_time(at(0))
    train.checkpoint_event_logger(cfg, enabled=True).log_entry(restore_event(1, 0.5))
    job = train.goodput_job_name("job", "gs://bucket/job/orbax")
    assert created == {"recorder": (job, train.GOODPUT_LOG_NAME), "orbax": (job, train.GOODPUT_LOG_NAME)}
    assert written == [{"job_name": job, "job_start_time": T0}, restore_event(1, 0.5)]


def test_without_cloud_logging_the_training_goes_on_unrecorded(monkeypatch, tmp_path, capsys):
    """No credentials, or a write denied: goodput is a report, nothing raises into the training."""
    import orbax.checkpoint as ocp

    def no_credentials(*args, **kwargs):
        raise RuntimeError("no credentials")

    class DeniedOrbaxLogger:
        def __init__(self, options):
            pass

        def log_entry(self, entry):
            raise PermissionError("logging.logEntries.create denied")

    monkeypatch.setattr(goodput, "_CloudLogger", no_credentials)
    monkeypatch.setattr(ocp.logging, "CloudLogger", DeniedOrbaxLogger)
    cfg = config(tmp_path, logger="cloud") | {"checkpoint_dir": "gs://bucket/job/orbax"}
    train.goodput_recorder(cfg, enabled=True).record_job_start_time(at(0))  # a disabled recorder
    train.checkpoint_event_logger(cfg, enabled=True).log_entry(restore_event(1, 0.5))
    assert train.write_goodput_result(cfg, finished=True) is None
    out = capsys.readouterr().out
    assert "[goodput] not recorded: RuntimeError: no credentials" in out
    assert "[goodput] checkpoint event not recorded: PermissionError" in out
    assert "[goodput] not written: RuntimeError: no credentials" in out
    monkeypatch.setattr(ocp.logging, "CloudLogger", no_credentials)
    assert train.checkpoint_event_logger(cfg, enabled=True) is None


def test_with_cloud_records_a_runs_result_is_the_jobs_as_it_ends_and_the_jobs_view_names_no_run(monkeypatch, tmp_path):
    """Cloud Logging's entries name the job only (the library's query filters on job_name): a run's result is the job's
    account when it ends, still written under the run's own directory. Cloud Logging stubbed by one shared store."""
    monkeypatch.setattr(goodput, "_CloudLogger", lambda job_name, log_name, **kwargs: train.GoodputFileLogger(
        str(tmp_path / "cloud-logging"), job_name, "entries"))
    a_config, b_config = config(tmp_path, "a", logger="cloud"), config(tmp_path, "b", logger="cloud")
    a = train.goodput_recorder(a_config, enabled=True)
    a.record_job_start_time(at(0))
    steps(a, {0: 1, 1: 2, 2: 3})
    b = train.goodput_recorder(b_config, enabled=True)
    b.record_job_start_time(at(4))
    steps(b, {2: 5, 3: 6})
    b.record_job_end_time(at(7))

    result = train.write_goodput_result(b_config, finished=True)
    assert (result["run"], result["scope"], result["disruptions"]) == ("b", "job", 1)
    assert [str(p.relative_to(tmp_path / "orbax")) for p in (tmp_path / "orbax").rglob("*") if p.is_file()] == [
        "runs/b/goodput/result.json"]
    job = train.job_goodput(b_config)
    assert (job["runs"], job["overlapping"], job["disruptions"]) == (None, None, 1)
