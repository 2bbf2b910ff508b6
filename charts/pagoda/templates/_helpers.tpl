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

{{/*
The namespaced rules: what the operator does inside a served namespace.
tests/charts/test_rbac.py derives them from the requests the operator makes.
*/}}
{{- define "pagoda.namespacedRules" -}}
# The LLMServices: kopf watches them and patches away the finalizer earlier
# versions added (none is added now); the operator writes their status.
- apiGroups: ["pagoda.dev"]
  resources: ["llmservices"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["pagoda.dev"]
  resources: ["llmservices/status"]
  verbs: ["patch"]
# The built-in autoscaler reads and writes the LLMServices' replicas through
# their scale subresource, as an HPA does (never the Deployment).
- apiGroups: ["pagoda.dev"]
  resources: ["llmservices/scale"]
  verbs: ["get", "patch"]
# Children carry ownerReferences with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only to those
# who may update the owner's finalizers.
- apiGroups: ["pagoda.dev"]
  resources: ["llmservices/finalizers"]
  verbs: ["update"]
# Children: read (ownership check), server-side apply (patch, and create when
# the apply creates), watched so repair follows within seconds. Only the
# PodDisruptionBudget is deleted (replicas down to one); the rest goes with
# its LLMService through the garbage collector.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Secrets: each LLMService's admin Secret (the key of its pods' admin port) is
# read for its key and applied; an apiKeySecretRef is checked before pods roll
# out. Neither list nor watch: the operator never enumerates Secrets, and the
# admin Secret is repaired on the resync.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# autoscaling.mode keda: the ScaledObject is applied, and deleted when the
# mode changes (checked on every pass; a 404 where KEDA is not installed).
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "create", "patch", "delete"]
# Status: the runtime pods (Degraded, Progressing) and the Service's
# EndpointSlices (Ready: serving endpoints).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
# A model claim is checked before pods are rolled out (existence only).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
