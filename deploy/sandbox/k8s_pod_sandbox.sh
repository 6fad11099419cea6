#!/usr/bin/env bash
# Create or destroy one T1 sandbox as a Kubernetes pod, for the `command` sandbox provider.
#
# UNTESTED: written from the plan in docs/docker.md ("Kubernetes: the plan"); no cluster was reachable
# where it was written. Read it before use, try it on a scratch namespace first.
#
#   sandbox:
#     provider: command
#     command:
#       create: [deploy/sandbox/k8s_pod_sandbox.sh, create]
#       destroy: [deploy/sandbox/k8s_pod_sandbox.sh, destroy, "{id}"]
#       known_hosts: ~/.t1/k8s_known_hosts   # this script appends each new pod's host key here
#
# Run the coordinator inside the cluster (it dials each pod's IP on port 22). Once per namespace:
# `k8s_pod_sandbox.sh policy | kubectl apply -f -` (default deny; SSH in from the coordinator only;
# egress only for pods of tasks that allow the internet, never to the cluster's own ranges). At the
# coordinator's start, `k8s_pod_sandbox.sh reap` deletes the pods a dead coordinator of this host left.
#
# The pod: one container from the task's image (T1_IMAGE, passed by T1) holding the namespaces with
# `sleep infinity`, and a sidecar from T1_K8S_SSHD_IMAGE (an image you build: sshd, nsenter and a
# ForceCommand that enters the task container's process, e.g.
# `nsenter -t "$(pgrep -o -f 'sleep infinity')" -m -u -i -n -p -- /bin/bash -c "${SSH_ORIGINAL_COMMAND:-bash -l}"`,
# host keys generated at start, the authorized key from $T1_AUTHORIZED_KEY), sharing the pod's process
# namespace. Limits: requests = limits from T1_CPUS and T1_MEMORY_MB (Guaranteed QoS); ephemeral storage
# from T1_STORAGE_MB when set; activeDeadlineSeconds as the backstop when the coordinator dies.
#
# `create` prints one JSON line {"id", "host", "port", "user", "key_file", "known_hosts"} on stdout
# (progress goes to stderr). T1 passes T1_IMAGE, T1_ALLOW_NETWORK (0/1), T1_CPUS, T1_MEMORY_MB.
# Settings: T1_K8S_NAMESPACE (t1-sandboxes), T1_K8S_SSHD_IMAGE (required), T1_K8S_RUN (a run label;
# default: this host's name), T1_K8S_DEADLINE_S (7200), T1_K8S_READY_S (300), T1_K8S_PULL_SECRET (an
# imagePullSecret name, optional), T1_SSH_KEY (~/.ssh/t1_sandbox), T1_KNOWN_HOSTS (~/.t1/k8s_known_hosts).
set -euo pipefail

ns="${T1_K8S_NAMESPACE:-t1-sandboxes}"
key="${T1_SSH_KEY:-$HOME/.ssh/t1_sandbox}"
known_hosts="${T1_KNOWN_HOSTS:-$HOME/.t1/k8s_known_hosts}"
run_label="${T1_K8S_RUN:-$(hostname)}"
coordinator="$(hostname)"

kc() { kubectl --namespace "$ns" "$@"; }

pod_spec() {  # name image: the pod manifest (JSON) of docs/docker.md
  local name="$1" image="$2" cpus="${T1_CPUS:-2}" mem="${T1_MEMORY_MB:-4096}"
  [[ -n "$cpus" ]] || cpus=2
  [[ -n "$mem" ]] || mem=4096
  local internet=false storage="" pull_secrets="[]"
  [[ "${T1_ALLOW_NETWORK:-0}" == 1 ]] && internet=true
  [[ -n "${T1_STORAGE_MB:-}" ]] && storage=", \"ephemeral-storage\": \"${T1_STORAGE_MB}Mi\""
  [[ -n "${T1_K8S_PULL_SECRET:-}" ]] && pull_secrets="[{\"name\": \"$T1_K8S_PULL_SECRET\"}]"
  local limits="{\"cpu\": \"$cpus\", \"memory\": \"${mem}Mi\"$storage}"
  cat <<JSON
{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "$name", "labels": {"t1.sandbox": "$name", "t1.run": "$run_label",
               "t1.coordinator": "$coordinator", "t1.internet": "$internet"}},
  "spec": {
    "restartPolicy": "Never", "activeDeadlineSeconds": ${T1_K8S_DEADLINE_S:-7200},
    "automountServiceAccountToken": false, "enableServiceLinks": false, "shareProcessNamespace": true,
    "imagePullSecrets": $pull_secrets,
    "containers": [
      {"name": "task", "image": "$image", "imagePullPolicy": "IfNotPresent",
       "command": ["sleep", "infinity"], "workingDir": "/app",
       "resources": {"requests": $limits, "limits": $limits},
       "securityContext": {"allowPrivilegeEscalation": false, "seccompProfile": {"type": "RuntimeDefault"}}},
      {"name": "sshd", "image": "${T1_K8S_SSHD_IMAGE:?set T1_K8S_SSHD_IMAGE (see the header)}",
       "env": [{"name": "T1_AUTHORIZED_KEY", "value": "$(cat "$key.pub")"}],
       "ports": [{"containerPort": 22}],
       "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}},
       "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_PTRACE", "SYS_CHROOT", "SETUID", "SETGID"]},
                           "seccompProfile": {"type": "RuntimeDefault"}}}
    ]
  }
}
JSON
}

create() {
  [[ -f "$key" ]] || ssh-keygen -q -t ed25519 -N "" -f "$key" >&2
  mkdir -p "$(dirname "$known_hosts")"
  local name="t1-sb-$(date +%s)-$RANDOM" image="${T1_IMAGE:?T1 passes the task image as T1_IMAGE}"
  pod_spec "$name" "$image" | kc apply -f - >&2
  if ! kc wait --for=condition=Ready "pod/$name" --timeout="${T1_K8S_READY_S:-300}s" >&2; then
    local why
    why="$(kc get pod "$name" -o jsonpath='{.status.containerStatuses[*].state.waiting.reason}: {.status.containerStatuses[*].state.waiting.message}' || true)"
    kc delete pod "$name" --grace-period=0 --force --wait=false >&2 || true
    case "$why" in  # T1 reports a create failure; name the image when that is the cause
      *ErrImagePull*|*ImagePullBackOff*|*InvalidImageName*) echo "needs image $image: $why" >&2 ;;
      *) echo "pod $name did not become ready: $why" >&2 ;;
    esac
    exit 1
  fi
  local ip
  ip="$(kc get pod "$name" -o jsonpath='{.status.podIP}')"
  echo "$ip $(kc exec "$name" -c sshd -- cat /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f1,2)" >> "$known_hosts"
  printf '{"id": "%s", "host": "%s", "port": 22, "user": "root", "key_file": "%s", "known_hosts": "%s"}\n' \
    "$name" "$ip" "$key" "$known_hosts"
}

destroy() {
  local name="${1:?usage: $0 destroy ID}"
  kc delete pod "$name" --grace-period=0 --force --wait=false --ignore-not-found >&2
}

reap() {  # every pod this host's coordinators made: call at the coordinator's start, before any create
  kc delete pods -l "t1.sandbox,t1.coordinator=$coordinator" --grace-period=0 --force --wait=false >&2
}

policy() {  # NetworkPolicies for the namespace (print; pipe to kubectl apply -f -)
  cat <<YAML
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: t1-sandbox-default-deny, namespace: $ns}
spec:
  podSelector: {matchExpressions: [{key: t1.sandbox, operator: Exists}]}
  policyTypes: [Ingress, Egress]
  ingress:
    - from: [{namespaceSelector: {}, podSelector: {matchLabels: {t1.role: coordinator}}}]
      ports: [{port: 22, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: t1-sandbox-internet, namespace: $ns}
spec:
  podSelector: {matchLabels: {t1.internet: "true"}}
  policyTypes: [Egress]
  egress:
    - to:
        - ipBlock:
            cidr: 0.0.0.0/0
            # the cluster's pod, service and node ranges and the metadata address: set yours
            except: [${T1_K8S_PRIVATE_CIDRS:-10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16}]
YAML
}

case "${1:-}" in
  create) create ;;
  destroy) shift; destroy "$@" ;;
  reap) reap ;;
  policy) policy ;;
  spec) pod_spec "${2:-t1-sb-dry-run}" "${T1_IMAGE:?T1_IMAGE}" ;;  # print a pod manifest (kubectl apply --dry-run=server -f -)
  *) echo "usage: $0 create | destroy ID | reap | policy | spec [NAME]" >&2; exit 2 ;;
esac
