{{/*
Names and labels. Every helper takes a jsgw chart context: the chart's own `.`, or
`.Subcharts.jsgw` when an application chart includes the sidecar, so that both compute
the same names for the Secrets and the ConfigMap this chart renders.
*/}}

{{- define "jsgw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "jsgw.fullname" -}}
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

{{- define "jsgw.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "jsgw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jsgw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "jsgw.labels" -}}
helm.sh/chart: {{ include "jsgw.chart" . }}
{{ include "jsgw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: jsgw
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "jsgw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "jsgw.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "jsgw.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Secret names: the user's existing Secret, or the one this chart creates. */}}
{{- define "jsgw.credsSecretName" -}}
{{- .Values.nats.credsSecret.name | default (printf "%s-nats-creds" (include "jsgw.fullname" .)) }}
{{- end }}

{{- define "jsgw.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "jsgw.fullname" .)) }}
{{- end }}

{{- define "jsgw.ackSecretName" -}}
{{- .Values.ackSecret.existingSecret | default (printf "%s-ack" (include "jsgw.fullname" .)) }}
{{- end }}

{{- define "jsgw.subscriptionsName" -}}
{{- printf "%s-subscriptions" (include "jsgw.fullname" .) }}
{{- end }}

{{/* The file of push subscriptions (JSGW_SUBSCRIPTIONS); empty when none are declared. */}}
{{- define "jsgw.subscriptionsFile" -}}
{{- with .Values.subscriptions }}{{ toYaml . }}{{ end }}
{{- end }}

{{- define "jsgw.hasCreds" -}}
{{- if or .Values.nats.credsSecret.name .Values.nats.credsSecret.content }}true{{ end }}
{{- end }}

{{/* Settings that cannot be expressed in values.schema.json, checked once. */}}
{{- define "jsgw.validate" -}}
{{- if and (eq .Values.mode "standalone") (not .Values.auth.enabled) (not .Values.auth.allowUnauthenticated) }}
{{- fail "standalone mode listens on the pod network: keep auth.enabled, or set auth.allowUnauthenticated=true if something in front of the gateway authenticates" }}
{{- end }}
{{- if and .Values.nats.tls.enabled (not .Values.nats.tls.secretName) }}
{{- fail "nats.tls.enabled needs nats.tls.secretName" }}
{{- end }}
{{- if and .Values.nats.credsSecret.name .Values.nats.credsSecret.content }}
{{- fail "set nats.credsSecret.name or nats.credsSecret.content, not both" }}
{{- end }}
{{- if and .Values.auth.existingSecret .Values.auth.tokensFile }}
{{- fail "set auth.existingSecret or auth.tokensFile, not both" }}
{{- end }}
{{- end }}

{{/* The non-secret settings, shared by the ConfigMap and its checksum annotation. */}}
{{- define "jsgw.configData" -}}
JSGW_NATS_URL: {{ .Values.nats.url | quote }}
JSGW_PORT: {{ .Values.config.port | quote }}
JSGW_POOL_SIZE: {{ .Values.config.poolSize | quote }}
JSGW_REQUEST_TIMEOUT: {{ .Values.config.requestTimeout | quote }}
JSGW_LOG_LEVEL: {{ .Values.config.logLevel | quote }}
JSGW_WORKERS: {{ .Values.config.workers | quote }}
{{- with .Values.config.corsOrigins }}
JSGW_CORS_ORIGINS: {{ join "," . | quote }}
{{- end }}
{{- with .Values.nats.jsDomain }}
JSGW_JS_DOMAIN: {{ . | quote }}
{{- end }}
{{- with .Values.config.pushAllowedUrls }}
JSGW_PUSH_ALLOWED_URLS: {{ join "," . | quote }}
{{- end }}
{{- end }}

{{/* Pod annotations that restart the pods when the gateway's configuration changes (the
     subscriptions file too: the gateway reads it at start). */}}
{{- define "jsgw.checksumAnnotations" -}}
checksum/jsgw-config: {{ print (include "jsgw.configData" .) (include "jsgw.subscriptionsFile" .) | sha256sum }}
{{- end }}

{{/* The token file generated when auth is on and no tokens are given: one admin token
     (stored as its SHA-256) with every right on every resource. Takes the digest. */}}
{{- define "jsgw.adminTokensFile" -}}
tokens:
  - name: admin
    sha256: {{ . }}
    rules:
      - {resource: "stream:*", actions: [read, write, admin, consume]}
      - {resource: "kv:*", actions: [read, write, admin]}
      - {resource: "consumer:*/*", actions: [read, write, admin, consume]}
{{- end }}
