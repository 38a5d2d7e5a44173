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
{{- $seen := dict -}}
{{- $objects := dict -}}
{{- $leases := dict -}}
{{- $owners := dict -}}
{{- $handovers := list -}}
{{- range (include "vk-provider.nodes" . | fromJsonArray) -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" .name) -}}
{{- fail (printf "%s: %q is not a DNS subdomain" (ternary "nodeName" (printf "%s.name" .where) (eq .where "nodeName")) .name) -}}
{{- end -}}
{{- if and (gt (int .replicas) 1) (not .election) -}}
{{- fail (printf "%s: more than 1 needs leaderElection.enabled (two agents would register one node)" (ternary "replicas" (printf "%s.replicas" .where) (eq .where "nodeName"))) -}}
{{- end -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "%s.name: %q is also %s's: every node needs a name of its own" .where .name (get $seen .name)) -}}
{{- end -}}
{{- if hasKey $objects .object -}}
{{- fail (printf "%s.name: %q makes the object name %q, as %s does: shorten a name" .where .name .object (get $objects .object)) -}}
{{- end -}}
{{- $_ := set $seen .name .where -}}
{{- $_ := set $objects .object .where -}}
{{- if hasKey $leases .lease -}}
{{- fail (printf "leaderElection.config.lease_name: %q would be the Lease of %s and %s, so only one of them would run; leave it unset (one Lease per node)" .lease (get $leases .lease) .where) -}}
{{- end -}}
{{- $_ := set $leases .lease .where -}}
{{- $where := .where -}}
{{- range .providers -}}
{{- if hasKey $owners . -}}
{{- fail (printf "%s.config.providers: %q is also a provider of %s: an agent takes every instance of its providers' names that no pod of its own node claims for an orphan, so each node needs providers of names of its own (one account may serve several under different names; config.providers is every node's that sets none)" $where . (get $owners .)) -}}
{{- end -}}
{{- $_ := set $owners . $where -}}
{{- end -}}
{{- if .handover -}}
{{- $handovers = append $handovers .where -}}
{{- end -}}
{{- end -}}
{{- if gt (len $handovers) 1 -}}
{{- fail (printf "%s.config.overflow.handover.enabled: the hand-over claims the cluster's own GPU nodes, so one node's agent runs it, not %s" (last $handovers) (join " and " $handovers)) -}}
{{- end -}}
{{- range $i, $c := .Values.credentials -}}
{{- if not (and $c.env $c.secretName $c.key) -}}
{{- fail (printf "credentials[%d]: needs env, secretName and key" $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The agent's config.yaml for one node (dict "root" $ "node" <entry of vk-provider.nodes'
input>): the chart's settings, then .Values.config over them, then the node's own config. */}}
{{- define "vk-provider.config" -}}
{{- $root := .root -}}
{{- $node := dict "name" .node.name -}}
{{- with .node.labels -}}
{{- $_ := set $node "labels" . -}}
{{- end -}}
{{- $base := dict
  "node" $node
  "identity" (dict "mode" $root.Values.identity)
  "kubelet_api" (dict "listen" (printf "0.0.0.0:%d" (int $root.Values.ports.kubeletApi)))
  "rest" (dict "listen" (printf "0.0.0.0:%d" (int $root.Values.ports.rest)))
-}}
{{- $election := dict "enabled" ($root.Values.leaderElection.enabled | default false) -}}
{{- if $root.Values.leaderElection.enabled -}}
{{- $election = mustMergeOverwrite (dict "enabled" true "namespace" $root.Release.Namespace) (deepCopy $root.Values.leaderElection.config) -}}
{{- end -}}
{{- $_ := set $base "leader_election" $election -}}
{{- $config := mustMergeOverwrite $base (deepCopy $root.Values.config) (deepCopy (.node.config | default dict)) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The release's virtual nodes, as JSON (fromJsonArray): each with its name, the name of
its objects (Deployment, ConfigMap, Service), its replicas, its config.yaml (as text) and the
labels that select its pods. `nodes` empty: one node, `nodeName`, whose objects carry the
release's full name (as before there were several). Otherwise one per entry of `nodes`,
named <fullname>-<node name>, its pods labelled vk-provider.io/node-agent with that name. */}}
{{- define "vk-provider.nodes" -}}
{{- $full := include "vk-provider.fullname" . -}}
{{- $selector := include "vk-provider.selectorLabels" . | fromYaml -}}
{{- $nodes := list -}}
{{- if not (kindIs "slice" (.Values.nodes | default list)) -}}
{{- fail "nodes: must be a list of nodes, each with a name" -}}
{{- end -}}
{{- if .Values.nodes -}}
{{- range $i, $entry := .Values.nodes -}}
{{- if not (kindIs "map" $entry) -}}
{{- fail (printf "nodes[%d]: must be a mapping with a name" $i) -}}
{{- end -}}
{{- $name := toString (required (printf "nodes[%d].name: every node needs a name" $i) $entry.name) -}}
{{- $replicas := $.Values.replicas -}}
{{- if hasKey $entry "replicas" -}}
{{- $replicas = $entry.replicas -}}
{{- end -}}
{{- $object := printf "%s-%s" $full $name | trunc 63 | trimSuffix "-" | trimSuffix "." -}}
{{- $given := dict "name" $name "labels" ($entry.labels | default dict) "config" ($entry.config | default dict) -}}
{{- $config := include "vk-provider.config" (dict "root" $ "node" $given) -}}
{{- $labels := merge (dict "vk-provider.io/node-agent" $object) $selector -}}
{{- $nodes = append $nodes (include "vk-provider.node" (dict "where" (printf "nodes[%d]" $i) "object" $object "replicas" $replicas "config" $config "selector" $labels) | fromJson) -}}
{{- end -}}
{{- else -}}
{{- $given := dict "name" .Values.nodeName "labels" dict "config" dict -}}
{{- $config := include "vk-provider.config" (dict "root" . "node" $given) -}}
{{- $nodes = list (include "vk-provider.node" (dict "where" "nodeName" "object" $full "replicas" .Values.replicas "config" $config "selector" $selector) | fromJson) -}}
{{- end -}}
{{- toJson $nodes -}}
{{- end -}}

{{/* One node of vk-provider.nodes: what its config.yaml says its name, Lease and features
are (a name set in `config` wins, as it does in the agent). */}}
{{- define "vk-provider.node" -}}
{{- $parsed := .config | fromYaml -}}
{{- $name := toString (dig "node" "name" "" $parsed) -}}
{{- $lease := dig "leader_election" "lease_name" "" $parsed | default (printf "vk-provider-leader-%s" $name) -}}
{{- $providers := list -}}
{{- range (dig "providers" list $parsed) -}}
{{- if kindIs "map" . -}}
{{- $providers = append $providers (toString (dig "name" "" .)) -}}
{{- end -}}
{{- end -}}
{{- $api := dig "kubelet_api" dict $parsed -}}
{{- $source := dig "serving" "source" "" $api -}}
{{- $given := or (dig "tls_cert_file" "" $api) (dig "tls_key_file" "" $api) -}}
{{- $signed := or (eq $source "cluster") (and (eq $source "") (not $given)) -}}
{{- toJson (dict
  "where" .where "name" $name "object" .object "replicas" .replicas "config" .config
  "selector" .selector "lease" $lease "providers" $providers
  "election" (dig "leader_election" "enabled" false $parsed)
  "handover" (dig "overflow" "handover" "enabled" false $parsed)
  "moveHome" (dig "overflow" "move_home" "enabled" false $parsed)
  "traffic" (dig "endpoint_slices" "enabled" false $parsed)
  "signed" $signed
  "selfApprove" (and $signed (dig "serving" "self_approve" false $api))) -}}
{{- end -}}
