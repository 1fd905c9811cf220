{{/* Names and labels, after the `helm create` conventions. */}}

{{- define "timer-service.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "timer-service.fullname" -}}
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

{{- define "timer-service.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Replicas are component "server", the hook Job "migrate": the Deployment, Service, PDB and monitors
select servers only, so a migration pod is never counted, scraped or sent traffic.
*/}}
{{- define "timer-service.selectorLabels" -}}
app.kubernetes.io/name: {{ include "timer-service.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/*
Labels on every object: the user's commonLabels, then the chart's (which win, so a commonLabel
can never change what the selectors match). Arg: (dict "ctx" $ "component" <its component>).
*/}}
{{- define "timer-service.commonLabels" -}}
{{- $ctx := .ctx }}
{{- $labels := dict
  "helm.sh/chart" (include "timer-service.chart" $ctx)
  "app.kubernetes.io/name" (include "timer-service.name" $ctx)
  "app.kubernetes.io/instance" $ctx.Release.Name
  "app.kubernetes.io/version" $ctx.Chart.AppVersion
  "app.kubernetes.io/managed-by" $ctx.Release.Service
  "app.kubernetes.io/part-of" "timer-service" }}
{{- with .component }}{{ $_ := set $labels "app.kubernetes.io/component" . }}{{ end }}
{{- toYaml (merge $labels (deepCopy ($ctx.Values.commonLabels | default dict))) }}
{{- end }}

{{- define "timer-service.labels" -}}
{{ include "timer-service.commonLabels" (dict "ctx" . "component" "server") }}
{{- end }}

{{/*
An object's `annotations:` block: commonAnnotations under the object's own (which win), nothing
when both are empty. Arg: (dict "ctx" $ ["annotations" <the object's own: a dict, may be empty>]).
*/}}
{{- define "timer-service.annotations" -}}
{{- $all := merge (deepCopy (get . "annotations" | default dict)) (deepCopy (.ctx.Values.commonAnnotations | default dict)) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "timer-service.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "timer-service.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* [registry/]repository, then @digest or :tag (the chart's appVersion when empty). */}}
{{- define "timer-service.image" -}}
{{- $repository := .Values.image.repository }}
{{- with .Values.image.registry }}{{ $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Secret holding the secret settings: the user's, or the one this chart makes. */}}
{{- define "timer-service.secretName" -}}
{{- default (include "timer-service.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* The secret settings: env var, values key, key in the chart-made Secret. */}}
{{- define "timer-service.secretTable" -}}
- {env: TIMER_DATABASE_URL, value: databaseUrl, key: database-url}
- {env: TIMER_NATS_PASSWORD, value: natsPassword, key: nats-password}
- {env: TIMER_NATS_TOKEN, value: natsToken, key: nats-token}
- {env: TIMER_NATS_NKEY_SEED, value: natsNkeySeed, key: nats-nkey-seed}
{{- end }}

{{/* Data of the chart-made Secret: the secret values given (nothing with existingSecret). */}}
{{- define "timer-service.secretData" -}}
{{- $s := .Values.secrets }}
{{- if not $s.existingSecret }}
{{- range $row := include "timer-service.secretTable" . | fromYamlArray }}
{{- with get $s $row.value }}
{{ $row.key }}: {{ . | b64enc | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
env entries that read the secret settings through secretKeyRef: from existingSecret the keys named
in values, from the chart-made Secret the ones given; with neither, the DSN of postgresCluster.
Arg: (dict "ctx" $ "secret" <Secret name> "postgresOnly" <bool: just the DSN, for the migration>).
*/}}
{{- define "timer-service.secretEnv" -}}
{{- $s := .ctx.Values.secrets }}
{{- range include "timer-service.secretTable" .ctx | fromYamlArray }}
{{- if or (not $.postgresOnly) (eq .env "TIMER_DATABASE_URL") }}
{{- $key := "" }}
{{- if $s.existingSecret }}{{ $key = get $s (printf "%sKey" .value) }}
{{- else if get $s .value }}{{ $key = .key }}{{ end }}
{{- if $key }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ $.secret }}
      key: {{ $key }}
{{- else if and (eq .env "TIMER_DATABASE_URL") (include "timer-service.dsnFromCluster" $.ctx) }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ include "timer-service.postgresCluster" $.ctx }}-app
      key: uri
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The CloudNativePG Cluster's name: its Services and Secrets are named after it (-rw, -app). */}}
{{- define "timer-service.postgresCluster" -}}
{{- printf "%s-pg" (include "timer-service.fullname" .) | trunc 50 | trimSuffix "-" }}
{{- end }}

{{/* "true" when the DSN is postgresCluster's: enabled, and no other database named in secrets. */}}
{{- define "timer-service.dsnFromCluster" -}}
{{- with .Values }}
{{- if and .postgresCluster.enabled (not .secrets.existingSecret) (not .secrets.databaseUrl) }}true{{ end }}
{{- end }}
{{- end }}

{{/* Drain timeout in whole seconds, rounded up. */}}
{{- define "timer-service.drainSeconds" -}}
{{- div (add (int .Values.config.drainTimeoutMs) 999) 1000 }}
{{- end }}

{{/* terminationGracePeriodSeconds: given (and checked) or derived from the drain timeout. */}}
{{- define "timer-service.gracePeriod" -}}
{{- $drain := int (include "timer-service.drainSeconds" .) }}
{{- $given := .Values.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $given }}
{{- add $drain 5 }}
{{- else if le (int $given) $drain }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed config.drainTimeoutMs (%d s), or Kubernetes kills replicas mid-drain" (int $given) $drain) }}
{{- else }}
{{- int $given }}
{{- end }}
{{- end }}

{{/*
Secret volumes for NATS creds, NATS TLS and Postgres TLS, and their mounts.
Arg: (dict "ctx" $ "postgresOnly" <bool: just Postgres TLS, for the migration>).
*/}}
{{- define "timer-service.fileVolumes" -}}
{{- with .ctx }}
{{- if and (not $.postgresOnly) .Values.natsCreds.existingSecret }}
- name: nats-creds
  secret:
    secretName: {{ .Values.natsCreds.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if and (not $.postgresOnly) .Values.natsTls.existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ .Values.natsTls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.postgresTls.existingSecret }}
- name: postgres-tls
  secret:
    secretName: {{ .Values.postgresTls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end }}

{{- define "timer-service.fileMounts" -}}
{{- with .ctx }}
{{- if and (not $.postgresOnly) .Values.natsCreds.existingSecret }}
- name: nats-creds
  mountPath: /etc/timer-service/nats-creds
  readOnly: true
{{- end }}
{{- if and (not $.postgresOnly) .Values.natsTls.existingSecret }}
- name: nats-tls
  mountPath: /etc/timer-service/nats-tls
  readOnly: true
{{- end }}
{{- if .Values.postgresTls.existingSecret }}
- name: postgres-tls
  mountPath: /etc/timer-service/postgres-tls
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/* Paths of the mounted files, as env entries. */}}
{{- define "timer-service.fileEnv" -}}
{{- with .Values.natsCreds }}
{{- if .existingSecret }}
- name: TIMER_NATS_CREDS
  value: /etc/timer-service/nats-creds/{{ .key }}
{{- end }}
{{- end }}
{{- with .Values.natsTls }}
{{- if .existingSecret }}
{{- if .caKey }}
- name: TIMER_NATS_TLS_CA
  value: /etc/timer-service/nats-tls/{{ .caKey }}
{{- end }}
{{- if .certKey }}
- name: TIMER_NATS_TLS_CERT
  value: /etc/timer-service/nats-tls/{{ .certKey }}
{{- end }}
{{- if .keyKey }}
- name: TIMER_NATS_TLS_KEY
  value: /etc/timer-service/nats-tls/{{ .keyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The console's pods: component "console", so no replica selector ever matches them. */}}
{{- define "timer-service.consoleSelectorLabels" -}}
app.kubernetes.io/name: {{ include "timer-service.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: console
{{- end }}

{{- define "timer-service.consoleName" -}}
{{- printf "%s-console" (include "timer-service.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The console's credentials as env entries: from console.existingSecret the keys named in values,
else from the chart-made <fullname>-console Secret the ones given. Fails when there are none, or a
password without a user: the console would refuse to start, better the install says so.
*/}}
{{- define "timer-service.consoleSecretEnv" -}}
{{- $c := .Values.console }}
{{- $name := $c.existingSecret | default (include "timer-service.consoleName" .) }}
{{- $token := ternary $c.tokenKey (ternary "console-token" "" (ne $c.token "")) (ne $c.existingSecret "") }}
{{- $password := ternary $c.passwordKey (ternary "console-password" "" (ne $c.password "")) (ne $c.existingSecret "") }}
{{- if not (or $token $password $c.identityProxy.userHeader) }}
{{- fail "console.enabled needs credentials: console.existingSecret with console.tokenKey (or console.user and console.passwordKey), or for a trial console.token (or console.user and console.password), or console.identityProxy" }}
{{- end }}
{{- if and $password (not $c.user) }}
{{- fail "console: a password needs console.user" }}
{{- end }}
{{- if $token }}
- name: TIMER_CONSOLE_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $name }}
      key: {{ $token }}
{{- end }}
{{- if $password }}
- name: TIMER_CONSOLE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $name }}
      key: {{ $password }}
{{- end }}
{{- end }}
