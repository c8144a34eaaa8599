"""tpu-fallback: GKE TPU training on a ladder of capacity (reservation, on-demand, Spot, DWS flex-start), with failover.

A table of contents: a stack has one role, picked from its config.
- platform (roles/platform.py): the cluster, TPU pools, Kueue, failover controller, monitoring, and (one team)
  the training jobs;
- team (roles/team.py), a stack that sets `tpu-fallback:platformStack`: one team's training jobs on the shared
  cluster of that platform stack;
- fleet (roles/fleet.py), a stack that sets `tpu-fallback:fleet`: a MultiKueue manager over several regional
  platform stacks (plan C), and the training jobs, which run in the first region with TPUs.
"""

import pulumi

from roles import fleet, platform, team

if team.is_team_stack(pulumi.Config()):
    team.deploy()
elif fleet.is_fleet_stack(pulumi.Config()):
    fleet.deploy()
else:
    platform.deploy()
