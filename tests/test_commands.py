"""The `nextSteps` output: the seed's verification commands, with this stack's names."""

from __future__ import annotations

from tests.conftest import plan_for


def test_next_steps_name_this_stacks_cluster_queues_and_jobs():
    steps = plan_for().outputs["nextSteps"]
    assert steps[0] == ("gcloud container clusters get-credentials tpu-cluster "
                        "--location=us-east5-b --project=example-project")
    assert "kubectl get clusterqueue cluster-queue cluster-queue-dws" in steps
    assert "kubectl get localqueue user-queue user-queue-dws -n default" in steps
    assert "kubectl logs -n tpu-fallback-system deploy/failover-controller" in steps
    assert ('gcloud container node-pools describe dws-pool --cluster=tpu-cluster --location=us-east5-b '
            '--project=example-project --format="get(config.flexStart)"') in steps
    assert "kubectl logs -f job/rayjob-tpu-v6e-dws-1" in steps


def test_next_steps_check_every_plan_b_pool_and_none_without_plan_b():
    team_c = plan_for("team-c-us-west4-a").outputs["nextSteps"]
    assert sum("node-pools describe team-c-dws-" in step for step in team_c) == 2
    without_b = plan_for(overrides={"flexStart": {"maxSlices": 0}}).outputs["nextSteps"]
    assert not any("flexStart" in step for step in without_b)
    assert not any("failover" in step for step in team_c + without_b)  # one rung: no controller
