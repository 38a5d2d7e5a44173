{{/* The release's full name: cluster-scoped objects carry it, so two releases never clash. */}}
{{- define "vk-provider.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vk-provider.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vk-provider.labels" -}}
{{ include "vk-provider.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "vk-provider.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vk-provider.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "vk-provider.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Bad values fail the render with the name of the value. */}}
{{- define "vk-provider.validate" -}}
{{- if not (has .Values.identity (list "serviceAccount" "node")) -}}
{{- fail (printf "identity: must be serviceAccount or node, not %q" (toString .Values.identity)) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas: more than 1 needs leaderElection.enabled (two agents would register one node)" -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" .Values.nodeName) -}}
{{- fail (printf "nodeName: %q is not a DNS subdomain" .Values.nodeName) -}}
{{- end -}}
{{- range $i, $c := .Values.credentials -}}
{{- if not (and $c.env $c.secretName $c.key) -}}
{{- fail (printf "credentials[%d]: needs env, secretName and key" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The agent's config.yaml: the chart's settings, then .Values.config over them. */}}
{{- define "vk-provider.config" -}}
{{- $base := dict
  "node" (dict "name" .Values.nodeName)
  "identity" (dict "mode" .Values.identity)
  "kubelet_api" (dict "listen" (printf "0.0.0.0:%d" (int .Values.ports.kubeletApi)))
  "rest" (dict "listen" (printf "0.0.0.0:%d" (int .Values.ports.rest)))
-}}
{{- $election := dict "enabled" (.Values.leaderElection.enabled | default false) -}}
{{- if .Values.leaderElection.enabled -}}
{{- $election = mustMergeOverwrite (dict "enabled" true "namespace" .Release.Namespace) (deepCopy .Values.leaderElection.config) -}}
{{- end -}}
{{- $_ := set $base "leader_election" $election -}}
{{- $config := mustMergeOverwrite $base (deepCopy .Values.config) -}}
{{- toYaml $config -}}
{{- end -}}
