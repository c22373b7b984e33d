{{/*
The gateway container and its volumes, shared by this chart's Deployment (standalone mode)
and by application charts that add the gateway to their own pods (sidecar mode):

    initContainers:
      {{- include "jsgw.sidecar" .Subcharts.jsgw | nindent 8 }}
    volumes:
      {{- include "jsgw.volumes" .Subcharts.jsgw | nindent 8 }}

Volume names start with "jsgw-" so that they do not collide with the application's.
*/}}

{{/* A native sidecar: started before the app containers, stopped after them. */}}
{{- define "jsgw.sidecar" -}}
{{- if ne .Values.mode "sidecar" }}
{{- fail "jsgw.sidecar is for sidecar mode: set mode: sidecar in the jsgw values" }}
{{- end }}
{{- include "jsgw.container" . }}
{{- end }}

{{- define "jsgw.container" -}}
{{- include "jsgw.validate" . }}
{{- $sidecar := eq .Values.mode "sidecar" -}}
- name: jsgw
  image: {{ include "jsgw.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if $sidecar }}
  restartPolicy: Always
  {{- end }}
  args: ["serve"]
  ports:
    - name: {{ ternary "jsgw-http" "http" $sidecar }}
      containerPort: {{ .Values.config.port }}
      protocol: TCP
  envFrom:
    - configMapRef:
        name: {{ include "jsgw.fullname" . }}
  env:
    # 0.0.0.0 behind a Service; 127.0.0.1 as a sidecar, which serves only its own pod.
    - name: JSGW_HOST
      value: {{ ternary "127.0.0.1" "0.0.0.0" $sidecar | quote }}
    - name: JSGW_ACK_SECRET
      valueFrom:
        secretKeyRef:
          name: {{ include "jsgw.ackSecretName" . }}
          key: {{ .Values.ackSecret.key | quote }}
    {{- if include "jsgw.hasCreds" . }}
    - name: JSGW_NATS_CREDS
      value: /etc/jsgw/nats-creds/nats.creds
    {{- end }}
    {{- if .Values.nats.tls.enabled }}
    - name: JSGW_NATS_TLS_CA
      value: /etc/jsgw/nats-tls/ca.crt
    {{- if .Values.nats.tls.clientCert }}
    - name: JSGW_NATS_TLS_CERT
      value: /etc/jsgw/nats-tls/tls.crt
    - name: JSGW_NATS_TLS_KEY
      value: /etc/jsgw/nats-tls/tls.key
    {{- end }}
    {{- end }}
    {{- if .Values.auth.enabled }}
    - name: JSGW_AUTH_FILE
      value: {{ printf "/etc/jsgw/auth/%s" .Values.auth.key | quote }}
    {{- else if and (not $sidecar) .Values.auth.allowUnauthenticated }}
    - name: JSGW_ALLOW_UNAUTHENTICATED
      value: "true"
    {{- end }}
    {{- if include "jsgw.subscriptionsFile" . }}
    - name: JSGW_SUBSCRIPTIONS
      value: /etc/jsgw/subscriptions/subscriptions.yaml
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- range $kind, $path := dict "startup" "/healthz" "readiness" "/readyz" "liveness" "/healthz" }}
  {{- $probe := index $.Values.probes $kind }}
  {{- if $probe.enabled }}
  {{ $kind }}Probe:
    {{- if $sidecar }}
    # The kubelet probes the pod IP, where a loopback-only sidecar does not listen:
    # ask from inside the container instead.
    exec:
      command:
        - python
        - -c
        - {{ printf "import urllib.request; urllib.request.urlopen('http://127.0.0.1:%v%s', timeout=%v)" $.Values.config.port $path $probe.timeoutSeconds | quote }}
    {{- else }}
    httpGet:
      path: {{ $path }}
      port: http
    {{- end }}
    periodSeconds: {{ $probe.periodSeconds }}
    timeoutSeconds: {{ $probe.timeoutSeconds }}
    failureThreshold: {{ $probe.failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: jsgw-tmp
      mountPath: /tmp
    {{- if include "jsgw.hasCreds" . }}
    - name: jsgw-nats-creds
      mountPath: /etc/jsgw/nats-creds
      readOnly: true
    {{- end }}
    {{- if .Values.nats.tls.enabled }}
    - name: jsgw-nats-tls
      mountPath: /etc/jsgw/nats-tls
      readOnly: true
    {{- end }}
    {{- if .Values.auth.enabled }}
    - name: jsgw-auth
      mountPath: /etc/jsgw/auth
      readOnly: true
    {{- end }}
    {{- if include "jsgw.subscriptionsFile" . }}
    - name: jsgw-subscriptions
      mountPath: /etc/jsgw/subscriptions
      readOnly: true
    {{- end }}
{{- end }}

{{/*
Secret files are readable by the gateway's group (fsGroup) in its own pod; in an app's pod
the fsGroup is the app's, so they are made world-readable within that pod instead.
*/}}
{{- define "jsgw.secretMode" -}}
{{- if and (ne .Values.mode "sidecar") .Values.podSecurityContext.fsGroup }}0440{{ else }}0444{{ end }}
{{- end }}

{{- define "jsgw.volumes" -}}
- name: jsgw-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if include "jsgw.hasCreds" . }}
- name: jsgw-nats-creds
  secret:
    secretName: {{ include "jsgw.credsSecretName" . }}
    defaultMode: {{ include "jsgw.secretMode" . }}
    items:
      - key: {{ .Values.nats.credsSecret.key | quote }}
        path: nats.creds
{{- end }}
{{- if .Values.nats.tls.enabled }}
- name: jsgw-nats-tls
  secret:
    secretName: {{ .Values.nats.tls.secretName }}
    defaultMode: {{ include "jsgw.secretMode" . }}
    items:
      - key: {{ .Values.nats.tls.caKey | quote }}
        path: ca.crt
      {{- if .Values.nats.tls.clientCert }}
      - key: {{ .Values.nats.tls.certKey | quote }}
        path: tls.crt
      - key: {{ .Values.nats.tls.keyKey | quote }}
        path: tls.key
      {{- end }}
{{- end }}
{{- if .Values.auth.enabled }}
- name: jsgw-auth
  secret:
    secretName: {{ include "jsgw.authSecretName" . }}
    defaultMode: {{ include "jsgw.secretMode" . }}
    items:
      - key: {{ .Values.auth.key | quote }}
        path: {{ .Values.auth.key | quote }}
{{- end }}
{{- if include "jsgw.subscriptionsFile" . }}
- name: jsgw-subscriptions
  configMap:
    name: {{ include "jsgw.subscriptionsName" . }}
    items:
      - key: subscriptions.yaml
        path: subscriptions.yaml
{{- end }}
{{- end }}
