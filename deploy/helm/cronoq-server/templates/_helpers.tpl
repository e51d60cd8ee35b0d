{{/* Names and labels, the usual way: the release name alone when it already names the chart. */}}
{{- define "cronoq-server.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cronoq-server.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cronoq-server.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronoq-server.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cronoq-server.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cronoq-server.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "cronoq-server.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* A port from values, checked: a typo here would only show as a pod that never listens. */}}
{{- define "cronoq-server.port" -}}
{{- $port := int64 (index .Values.ports .name) -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "ports.%s must be from 1 to 65535, got %v" .name (index .Values.ports .name)) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: drain_timeout_s (the server's default, 30, when the config does not
set it) rounded up, plus the margin for closing the scheduler and releasing leadership.
*/}}
{{- define "cronoq-server.gracePeriod" -}}
{{- $config := .Values.config | default dict -}}
{{- $drain := 30 -}}
{{- if hasKey $config "drain_timeout_s" -}}{{- $drain = index $config "drain_timeout_s" -}}{{- end -}}
{{- $margin := int64 .Values.terminationGraceMarginSeconds -}}
{{- if lt $margin 1 -}}
{{- fail "terminationGraceMarginSeconds must be at least 1: the drain must end before SIGKILL" -}}
{{- end -}}
{{- add (int64 (ceil $drain)) $margin -}}
{{- end -}}

{{/*
A TOML key (quoted unless bare) and a TOML value. Helm reads every number of a values file as a
float, and the server takes integers only as TOML integers, so a whole number is written as one.
A string as JSON is a TOML basic string.
*/}}
{{- define "cronoq-server.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{- define "cronoq-server.tomlValue" -}}
{{- if kindIs "string" . -}}{{ toJson . }}
{{- else if kindIs "bool" . -}}{{ . }}
{{- else if or (kindIs "int" .) (kindIs "int64" .) -}}{{ . }}
{{- else if kindIs "float64" . -}}
{{- if eq (float64 (int64 .)) . -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{- fail (printf "config: %v is not a TOML string, number or boolean" .) -}}
{{- end -}}
{{- end -}}

{{- define "cronoq-server.tomlTable" -}}
{{- range $key, $value := . }}
{{- if not (kindIs "invalid" $value) }}{{/* null: not set (max_live = null is unbounded) */}}
{{ include "cronoq-server.tomlKey" $key }} = {{ include "cronoq-server.tomlValue" $value }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
server.toml from .Values.config: its scalars at the top, its maps as [tables], its lists as
[[arrays of tables]] (pools). The chart owns [listen] and store.kind; the DSN is a secret, so it
comes from the environment. Every key is the server's to judge (check-config), not the chart's.
*/}}
{{- define "cronoq-server.serverToml" -}}
{{- $config := .Values.config | default dict -}}
{{- $store := index $config "store" | default dict -}}
{{- if hasKey $config "listen" -}}
{{- fail "config.listen is set by the chart from ports.grpc and ports.http" -}}
{{- end -}}
{{- if or (hasKey $config "auth") (hasKey $config "tls") -}}
{{- fail "config.auth and config.tls are set by the chart from auth and tls (docs/security.md)" -}}
{{- end -}}
{{- if or (hasKey $store "kind") (hasKey $store "dsn") -}}
{{- fail "config.store.kind and config.store.dsn are set by the chart: the DSN comes from the Secret postgres.existingSecret" -}}
{{- end -}}
# Rendered by the cronoq-server Helm chart from .Values.config.
# `cronoq-server check-config --config FILE` shows every setting with its source.
{{- range $key, $value := omit $config "store" }}
{{- if not (or (kindIs "map" $value) (kindIs "slice" $value) (kindIs "invalid" $value)) }}
{{ include "cronoq-server.tomlKey" $key }} = {{ include "cronoq-server.tomlValue" $value }}
{{- end }}
{{- end }}

[store]
kind = "postgres"
# dsn: from the Secret {{ .Values.postgres.existingSecret }}, as CRONOQ_STORE__DSN
{{- include "cronoq-server.tomlTable" $store }}

[listen]
grpc = "0.0.0.0:{{ include "cronoq-server.port" (dict "Values" .Values "name" "grpc") }}"
http = "0.0.0.0:{{ include "cronoq-server.port" (dict "Values" .Values "name" "http") }}"
{{- include "cronoq-server.securityToml" . }}
{{- range $section, $table := omit $config "store" }}
{{- if kindIs "map" $table }}

[{{ include "cronoq-server.tomlKey" $section }}]
{{- include "cronoq-server.tomlTable" $table }}
{{- end }}
{{- end }}
{{- range $name, $items := omit $config "store" }}
{{- if kindIs "slice" $items }}
{{- range $item := $items }}

[[{{ include "cronoq-server.tomlKey" $name }}]]
{{- include "cronoq-server.tomlTable" $item }}
{{- end }}
{{- end }}
{{- end }}
{{ end -}}

{{/* What the server container and the migrate Job's share: the DSN from the Secret, extra env. */}}
{{- define "cronoq-server.env" -}}
- name: CRONOQ_STORE__DSN
  valueFrom:
    secretKeyRef:
      name: {{ required "postgres.existingSecret: the Secret that holds the PostgreSQL DSN" .Values.postgres.existingSecret }}
      key: {{ required "postgres.secretKey: the Secret's key that holds the DSN" .Values.postgres.secretKey }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The pod settings both share. */}}
{{- define "cronoq-server.podCommon" -}}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
# The server never calls the Kubernetes API, and needs none of the service links' variables.
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
[tls] and [auth] from .Values.tls and .Values.auth: the files are the Secrets mounted by the
Deployment (secret volumes are updated in place, and the server reloads them on change).
*/}}
{{- define "cronoq-server.securityToml" -}}
{{- if .Values.tls.existingSecret }}

[tls]
cert = "/var/run/cronoq/tls/tls.crt"
key = "/var/run/cronoq/tls/tls.key"
{{- if .Values.tls.clientCaSecret }}
client_ca = "/var/run/cronoq/client-ca/ca.crt"
{{- end }}
{{- end }}

[auth]
{{- if .Values.auth.enabled }}
{{- if not .Values.auth.identities }}
{{- fail "auth.identities: at least one identity (or auth.enabled: false)" }}
{{- end }}
{{- if .Values.auth.tokensSecret }}
tokens_file = "/var/run/cronoq/tokens/{{ required "auth.tokensKey: the Secret's key that holds the tokens file" .Values.auth.tokensKey }}"
{{- end }}
{{- if .Values.auth.openMetrics }}
open_metrics = true
{{- end }}
{{- range .Values.auth.identities }}

[[auth.identities]]
{{- range $key, $value := . }}
{{ include "cronoq-server.tomlKey" $key }} = {{ if kindIs "slice" $value }}[{{ range $i, $item := $value }}{{ if $i }}, {{ end }}{{ include "cronoq-server.tomlValue" $item }}{{ end }}]{{ else }}{{ include "cronoq-server.tomlValue" $value }}{{ end }}
{{- end }}
{{- end }}
{{- else }}
# auth.enabled is false in the chart's values: anyone who reaches the port may do anything.
insecure = true
{{- end }}
{{- end -}}

{{/* The Secrets of [tls] and [auth], as volumes and their mounts. */}}
{{- define "cronoq-server.secretVolumes" -}}
{{- if .Values.tls.existingSecret }}
- name: tls
  secret:
    secretName: {{ .Values.tls.existingSecret }}
    # 0440: the private key readable by root and the pod's fsGroup only (the server warns
    # about a key or tokens file that every user may read).
    defaultMode: 288
{{- end }}
{{- if .Values.tls.clientCaSecret }}
- name: client-ca
  secret:
    secretName: {{ .Values.tls.clientCaSecret }}
{{- end }}
{{- if and .Values.auth.enabled .Values.auth.tokensSecret }}
- name: tokens
  secret:
    secretName: {{ .Values.auth.tokensSecret }}
    defaultMode: 288  # 0440, as the TLS key's
{{- end }}
{{- end -}}

{{- define "cronoq-server.secretMounts" -}}
{{- if .Values.tls.existingSecret }}
- name: tls
  mountPath: /var/run/cronoq/tls
  readOnly: true
{{- end }}
{{- if .Values.tls.clientCaSecret }}
- name: client-ca
  mountPath: /var/run/cronoq/client-ca
  readOnly: true
{{- end }}
{{- if and .Values.auth.enabled .Values.auth.tokensSecret }}
- name: tokens
  mountPath: /var/run/cronoq/tokens
  readOnly: true
{{- end }}
{{- end -}}
