{{/*
Names and labels shared by every template (the usual `helm create` shapes).
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "keyshard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's resources: the release name, with the chart name added
unless the release name already contains it. Truncated to 63 characters (DNS label);
53 would leave room for suffixes, so suffixed names truncate again.
*/}}
{{- define "keyshard.fullname" -}}
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

{{/* Name of the consumer-channel Service. */}}
{{- define "keyshard.consumerServiceName" -}}
{{- printf "%s-consumer" (include "keyshard.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* Name of the headless Service listing every ready replica (pod IPs, for consumers). */}}
{{- define "keyshard.replicasServiceName" -}}
{{- printf "%s-replicas" (include "keyshard.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* Name of the admin API Service. */}}
{{- define "keyshard.adminServiceName" -}}
{{- printf "%s-admin" (include "keyshard.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "keyshard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "keyshard.labels" -}}
helm.sh/chart: {{ include "keyshard.chart" . }}
{{ include "keyshard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: keyshard
{{- end }}

{{/* Labels that select the coordinator pod; they never change over upgrades. */}}
{{- define "keyshard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keyshard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: coordinator
{{- end }}

{{/* The ServiceAccount the pod runs as. */}}
{{- define "keyshard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "keyshard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the tokens: the user's existing one, or the chart's own. */}}
{{- define "keyshard.secretName" -}}
{{- default (include "keyshard.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{/* The Secret holding the replica secret: the user's, or the chart's own. */}}
{{- define "keyshard.replicaSecretName" -}}
{{- default (printf "%s-replica-secret" (include "keyshard.fullname" . | trunc 48 | trimSuffix "-")) .Values.replicaSecret.existingSecret }}
{{- end }}

{{/* Where the pod reads the replica secret (KEYSHARD_REPLICA_SECRET_FILE). */}}
{{- define "keyshard.replicaSecretPath" -}}
/etc/keyshard/replica-secret/{{ .Values.replicaSecret.key }}
{{- end }}

{{/* "true" when the pod reads the consumer token from a Secret. */}}
{{- define "keyshard.hasConsumerToken" -}}
{{- if .Values.auth.existingSecret }}
{{- if .Values.auth.consumerTokenKey }}true{{ end }}
{{- else if .Values.auth.consumerToken }}true{{ end }}
{{- end }}

{{/* "true" when the pod reads the admin token from a Secret. */}}
{{- define "keyshard.hasAdminToken" -}}
{{- if .Values.auth.existingSecret }}
{{- if .Values.auth.adminTokenKey }}true{{ end }}
{{- else if .Values.auth.adminToken }}true{{ end }}
{{- end }}

{{/* The admin API's scheme, for the probes: HTTPS with adminTls. */}}
{{- define "keyshard.adminScheme" -}}
{{- if .Values.adminTls.existingSecret }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* The image reference. */}}
{{- define "keyshard.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Guards that also hold when schema validation is skipped (--skip-schema-validation):
the same rules as values.schema.json, with the reason.
*/}}
{{- define "keyshard.validate" -}}
{{- if not .Values.config.bootstrapServers }}
{{- fail "config.bootstrapServers is required: the Kafka cluster as HOST:PORT[,HOST:PORT...] (in a cluster the coordinator never starts its embedded test broker)" }}
{{- end }}
{{- if and .Values.config.adminAuthReads (ne (include "keyshard.hasAdminToken" .) "true") }}
{{- fail "config.adminAuthReads needs an admin token: set auth.adminToken, or auth.existingSecret with auth.adminTokenKey" }}
{{- end }}
{{- if and .Values.serviceMonitor.tokenSecret.name (not .Values.serviceMonitor.tokenSecret.key) }}
{{- fail "serviceMonitor.tokenSecret.name needs serviceMonitor.tokenSecret.key: the key of the scrape token in that Secret" }}
{{- end }}
{{- if and (eq .Values.access.authorizer "acl-file") (not .Values.access.acls) }}
{{- fail "access.authorizer acl-file needs access.acls: the ACLs, a line each" }}
{{- end }}
{{- if and .Values.tls.requireClientCert (not .Values.tls.existingSecret) }}
{{- fail "tls.requireClientCert needs tls.existingSecret: the Secret's ca.crt is the CA client certificates must be signed by" }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the ACL file and the admin roles file (values: access). */}}
{{- define "keyshard.accessConfigName" -}}
{{- printf "%s-access" (include "keyshard.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/* The ConfigMap holding the Kafka client settings file, and where the pod sees it. */}}
{{- define "keyshard.kafkaConfigName" -}}
{{- printf "%s-kafka" (include "keyshard.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "keyshard.kafkaConfigPath" -}}
/etc/keyshard/kafka/kafka.properties
{{- end }}

{{/* The variable a secret Kafka setting arrives in: sasl.password -> KEYSHARD_KAFKA_SASL_PASSWORD. */}}
{{- define "keyshard.kafkaEnvName" -}}
{{- printf "KEYSHARD_KAFKA_%s" (. | replace "." "_" | upper) }}
{{- end }}
