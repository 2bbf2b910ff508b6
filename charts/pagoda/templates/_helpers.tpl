{{/* The chart's name. */}}
{{- define "pagoda.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, used for every object of the operator. */}}
{{- define "pagoda.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "pagoda.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagoda.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pagoda.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "pagoda.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pagoda
{{- end }}

{{- define "pagoda.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pagoda.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pagoda.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "pagoda.runtimeImage" -}}
{{ .Values.runtime.image.repository }}:{{ .Values.runtime.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The namespaced rules: what the operator does inside a served namespace. */}}
{{- define "pagoda.namespacedRules" -}}
# The LLMServices themselves: kopf watches them and patches annotations,
# finalizers and status.
- apiGroups: ["pagoda.dev"]
  resources: ["llmservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["pagoda.dev"]
  resources: ["llmservices/status"]
  verbs: ["get", "patch"]
# Children: server-side apply (patch), create where apply cannot, and the PDB
# is deleted when replicas drop to one. Everything else is garbage-collected.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
# Status: failing pods become a Degraded condition.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# References are checked before any pod is rolled out (existence only).
- apiGroups: [""]
  resources: ["secrets", "persistentvolumeclaims"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
