"""The names of what the program deploys on a cluster, which the controllers and `ops status` look for: Kueue's API,
namespace and manager configuration, the seed's queue objects, the DWS admission check, the controllers' Deployments
and the GKE node label of a pool. The program (infra/kueue.py, infra/failover.py, infra/fleet.py) creates the objects
under these names; `ops/` reads them from here, so it never imports the Pulumi program (issue 45, item 5).
"""

KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
# Another release name makes the controller crash-loop (kubernetes-sigs/kueue#6797).
KUEUE_RELEASE = "kueue"
KUEUE_NAMESPACE = "kueue-system"
# The chart's manager ConfigMap (`<fullname>-manager-config`) and its key: the configuration Kueue runs with.
# Ref: https://github.com/kubernetes-sigs/kueue/blob/v0.19.2/charts/kueue/templates/manager/manager-config.yaml
MANAGER_CONFIG_MAP = f"{KUEUE_RELEASE}-manager-config"
MANAGER_CONFIG_KEY = "controller_manager_config.yaml"

# The seed's object names, so its kubectl commands keep working.
DEFAULT_FLAVOR = "default-cpu"
CLUSTER_QUEUE = "cluster-queue"
LOCAL_QUEUE = "user-queue"

# DWS: the AdmissionCheck of the DWS rung, the ProvisioningRequest class it asks for, and the AdmissionCheck
# controller of DWS checks. Ref: https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest
DWS_ADMISSION_CHECK = "dws-prov"
PROVISIONING_CLASS = "queued-provisioning.gke.io"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
# A fleet's AdmissionCheck controller (Kueue MultiKueue, on the manager cluster).
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"

# GKE's label of a node's pool. Ref: https://cloud.google.com/kubernetes-engine/docs/concepts/node-pools
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"

# The controllers' Deployments: the regional failover controller in its namespace (failover/regional/), and on a
# fleet's manager the fleet watch (failover/watch/) and the ladder controller (failover/ladder/), in the same namespace.
CONTROLLER_NAMESPACE = "tpu-fallback-system"
CONTROLLER_NAME = "failover-controller"
FLEET_WATCH_NAME = "fleet-watch"
FLEET_LADDER_NAME = "fleet-ladder"
