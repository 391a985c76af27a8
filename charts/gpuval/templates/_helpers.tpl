{{/* Names and labels shared by every template. */}}

{{- define "gpuval.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuval.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpuval.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gpuval.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuval
{{- end }}

{{- define "gpuval.operatorSelector" -}}
app.kubernetes.io/name: {{ include "gpuval.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gpuval.operatorServiceAccount" -}}
{{- default (printf "%s-operator" (include "gpuval.fullname" .)) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "gpuval.agentServiceAccount" -}}
{{- default (printf "%s-agent" (include "gpuval.fullname" .)) .Values.agent.serviceAccount.name }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. Call with (list image appVersion). */}}
{{- define "gpuval.image" -}}
{{- $img := index . 0 }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default (index . 1) $img.tag) }}
{{- end }}
{{- end }}

{{/* Agent tolerations in the operator's KEY[=VALUE][:EFFECT] form, comma-separated. */}}
{{- define "gpuval.agentTolerations" -}}
{{- $out := list }}
{{- range .Values.agent.tolerations }}
{{- $t := .key }}
{{- if .value }}{{ $t = printf "%s=%s" $t .value }}{{ end }}
{{- if .effect }}{{ $t = printf "%s:%s" $t .effect }}{{ end }}
{{- $out = append $out $t }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/* Agent environment as NAME=VALUE pairs separated by ';' (sorted by name; then
GPUVAL_SIMULATE when agent.simulate is set, tests and demos only). */}}
{{- define "gpuval.agentEnv" -}}
{{- $out := list }}
{{- range $k, $v := .Values.agent.extraEnv }}
{{- $out = append $out (printf "%s=%s" $k (toString $v)) }}
{{- end }}
{{- with .Values.agent.simulate }}
{{- $out = append $out (printf "GPUVAL_SIMULATE=%s" .) }}
{{- end }}
{{- join ";" $out }}
{{- end }}

{{/* agent.fabric.resources as NAME=COUNT,NAME=COUNT (the operator's --fabric-resource). */}}
{{- define "gpuval.fabricResources" -}}
{{- $out := list }}
{{- range $k, $v := . }}
{{- $out = append $out (printf "%s=%d" $k (int $v)) }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/* "true" when agents would run the simulated GPU backend, however it is switched on:
agent.simulate, or agent.extraEnv GPUVAL_SIMULATE (non-empty) or GPUVAL_BACKEND=simulated. */}}
{{- define "gpuval.simulated" -}}
{{- $env := .Values.agent.extraEnv | default dict }}
{{- $sim := or .Values.agent.simulate (trim (toString (get $env "GPUVAL_SIMULATE"))) }}
{{- $backend := lower (trim (toString (get $env "GPUVAL_BACKEND"))) }}
{{- if or $sim (eq $backend "simulated") }}true{{ end }}
{{- end }}

{{/* The NCCL_* names a validation may set: the default allowlist (the same as
gpuval_crds::nccl_env::DEFAULT_ALLOWED; a chart test compares them) and
agent.fabric.ncclEnvAllowed, as a JSON list. */}}
{{- define "gpuval.ncclEnvAllowed" -}}
{{- $default := list "NCCL_SOCKET_IFNAME" "NCCL_SOCKET_FAMILY" "NCCL_IB_HCA" "NCCL_IB_GID_INDEX" "NCCL_IB_ROCE_VERSION_NUM" "NCCL_IB_DISABLE" "NCCL_NET" "NCCL_CROSS_NIC" "NCCL_NET_GDR_LEVEL" "NCCL_NET_GDR_READ" "NCCL_P2P_LEVEL" "NCCL_P2P_DISABLE" "NCCL_SHM_DISABLE" "NCCL_NVLS_ENABLE" "NCCL_COLLNET_ENABLE" "NCCL_IB_TC" "NCCL_IB_SL" "NCCL_IB_TIMEOUT" "NCCL_IB_RETRY_CNT" "NCCL_IB_QPS_PER_CONNECTION" "NCCL_IB_SPLIT_DATA_ON_QPS" "NCCL_IB_ADAPTIVE_ROUTING" "NCCL_IB_PCI_RELAXED_ORDERING" "NCCL_ALGO" "NCCL_PROTO" "NCCL_MIN_NCHANNELS" "NCCL_MAX_NCHANNELS" "NCCL_BUFFSIZE" "NCCL_NTHREADS" "NCCL_SOCKET_NTHREADS" "NCCL_NSOCKS_PERTHREAD" }}
{{- concat $default (.Values.agent.fabric.ncclEnvAllowed | default list) | uniq | toJson }}
{{- end }}

{{/* A CEL test of an NCCL name `e.name` that no allowlist can allow (gpuval_crds::nccl_env::forbidden):
it loads code, names a file or is the agent's own setting. */}}
{{- define "gpuval.ncclForbiddenCel" -}}
e.name.matches('PLUGIN|FILE|_PATH$|_DIR$|^NCCL_DEBUG') || e.name == 'NCCL_RUNTIME_CONNECT'
{{- end }}

{{/* Checks across values that a JSON schema cannot express well; fails with a plain message. */}}
{{- define "gpuval.validate" -}}
{{- range .Values.agent.fabric.ncclEnvAllowed }}
{{- if or (regexMatch "PLUGIN|FILE|_PATH$|_DIR$|^NCCL_DEBUG" .) (eq . "NCCL_RUNTIME_CONNECT") }}
{{- fail (printf "agent.fabric.ncclEnvAllowed lists %s, which no validation may set (it loads code, names a file or is the agent's own setting): remove it" .) }}
{{- end }}
{{- end }}
{{- if and (include "gpuval.simulated" .) (not .Values.agent.allowSimulated) }}
{{- fail "agents would run the SIMULATED GPU backend (agent.simulate, or agent.extraEnv GPUVAL_SIMULATE or GPUVAL_BACKEND=simulated): their results are not measurements of any GPU. On a real cluster remove it; for tests and demos also set agent.allowSimulated=true" }}
{{- end }}
{{- with .Values.agent.fabric }}
{{- if and (or .resources .capabilities) (not .hostNetwork) }}
{{- fail "agent.fabric.resources or agent.fabric.capabilities are set but agent.fabric.hostNetwork is false: RDMA devices and IPC_LOCK serve the host's NICs; set hostNetwork: true (or clear them)" }}
{{- end }}
{{- end }}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail (printf "operator.replicas is %d but operator.leaderElection.enabled is false: several replicas without leader election would all create agent pods; enable leader election or use one replica" (int .Values.operator.replicas)) }}
{{- end }}
{{- with .Values.agent.io.hostPath }}
{{- $path := trimSuffix "/" . }}
{{- $ok := false }}
{{- range $.Values.agent.io.allowedPaths }}
{{- $dir := trimSuffix "/" . }}
{{- if or (eq $path $dir) (hasPrefix (printf "%s/" $dir) $path) (eq $dir "") }}{{ $ok = true }}{{ end }}
{{- end }}
{{- if not $ok }}
{{- fail (printf "agent.io.hostPath %s is not inside any of agent.io.allowedPaths %v: add its parent directory to agent.io.allowedPaths (the administrator's allowlist) or choose an allowed directory" . $.Values.agent.io.allowedPaths) }}
{{- end }}
{{- end }}
{{- end }}
