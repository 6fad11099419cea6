#!/usr/bin/env bash
# Create or destroy one T1 sandbox VM on Google Compute Engine, for the `command` sandbox provider.
#
#   sandbox:
#     provider: command
#     command:
#       create: [deploy/sandbox/gcloud_sandbox.sh, create]
#       destroy: [deploy/sandbox/gcloud_sandbox.sh, destroy, "{id}"]
#       known_hosts: ~/.t1/known_hosts      # this script appends each new VM's host key here
#
# `create` prints one JSON line {"id", "host", "port", "user", "key_file", "known_hosts"} on stdout
# (progress goes to stderr). T1 passes the task's needs as T1_ALLOW_NETWORK (0/1), T1_CPUS and
# T1_MEMORY_MB. Settings: T1_GCE_PROJECT, T1_GCE_ZONE (us-central1-a), T1_GCE_IMAGE_FAMILY
# (debian-12), T1_GCE_IMAGE_PROJECT (debian-cloud), T1_GCE_NETWORK_TAG_NO_EGRESS (a tag whose
# firewall rule denies egress, used when T1_ALLOW_NETWORK=0), T1_SSH_KEY (~/.ssh/t1_sandbox),
# T1_KNOWN_HOSTS (~/.t1/known_hosts).
set -euo pipefail

zone="${T1_GCE_ZONE:-us-central1-a}"
key="${T1_SSH_KEY:-$HOME/.ssh/t1_sandbox}"
known_hosts="${T1_KNOWN_HOSTS:-$HOME/.t1/known_hosts}"
project_args=()
[[ -n "${T1_GCE_PROJECT:-}" ]] && project_args=(--project "$T1_GCE_PROJECT")

machine_type() {
  local cpus="${T1_CPUS:-2}" mem="${T1_MEMORY_MB:-4096}"
  cpus="${cpus%.*}"; ((cpus < 2)) && cpus=2; ((cpus % 2)) && cpus=$((cpus + 1))
  ((mem < cpus * 1024)) && mem=$((cpus * 1024))
  echo "e2-custom-${cpus}-$(( (mem + 255) / 256 * 256 ))"
}

create() {
  [[ -f "$key" ]] || ssh-keygen -q -t ed25519 -N "" -f "$key" >&2
  mkdir -p "$(dirname "$known_hosts")"
  local name="t1-sb-$(date +%s)-$RANDOM"
  local tags=(t1-sandbox)
  [[ "${T1_ALLOW_NETWORK:-0}" == 1 ]] || tags+=("${T1_GCE_NETWORK_TAG_NO_EGRESS:-t1-no-egress}")
  gcloud compute instances create "$name" "${project_args[@]}" --zone "$zone" \
    --machine-type "$(machine_type)" \
    --image-family "${T1_GCE_IMAGE_FAMILY:-debian-12}" --image-project "${T1_GCE_IMAGE_PROJECT:-debian-cloud}" \
    --tags "$(IFS=,; echo "${tags[*]}")" --labels t1=sandbox \
    --metadata "ssh-keys=root:$(cat "$key.pub")",startup-script='mkdir -p /app /logs /tests; sed -i "s/^#\?PermitRootLogin.*/PermitRootLogin prohibit-password/" /etc/ssh/sshd_config; systemctl reload ssh' \
    --format=none >&2
  local ip
  ip="$(gcloud compute instances describe "$name" "${project_args[@]}" --zone "$zone" \
        --format='get(networkInterfaces[0].accessConfigs[0].natIP)')"
  for _ in $(seq 60); do  # wait for sshd, then pin its host key
    if ssh-keyscan -T 5 -t ed25519 "$ip" 2>/dev/null | grep -q ed25519; then break; fi
    sleep 5
  done
  ssh-keyscan -T 5 -t ed25519 "$ip" 2>/dev/null >> "$known_hosts"
  printf '{"id": "%s", "host": "%s", "port": 22, "user": "root", "key_file": "%s", "known_hosts": "%s"}\n' \
    "$name" "$ip" "$key" "$known_hosts"
}

destroy() {
  local name="${1:?usage: $0 destroy ID}"
  gcloud compute instances delete "$name" "${project_args[@]}" --zone "$zone" --quiet >&2
}

case "${1:-}" in
  create) create ;;
  destroy) shift; destroy "$@" ;;
  *) echo "usage: $0 create | destroy ID" >&2; exit 2 ;;
esac
