{{/*
Names, labels and the image, shared by every template; and the sidecar as named templates that
charts running engines include into their own pod templates (README.md, "The sidecar").
*/}}

{{- define "gpumem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release name alone when it already says gpumem, so "gpumem" does not become "gpumem-gpumem". */}}
{{- define "gpumem.fullname" -}}
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

{{/*
No helm.sh/chart or managed-by label: Helm marks what it installs itself, and without them the
rendered objects are the same whether Helm or kubectl applies them (docker/k8s/node-agent).
*/}}
{{- define "gpumem.labels" -}}
{{ include "gpumem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpumem
{{- end }}

{{- define "gpumem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpumem.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "gpumem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpumem.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpumem.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Whether the cluster serves the Prometheus Operator's API (helm template: --api-versions). */}}
{{- define "gpumem.hasOperator" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/*
The gpumem sidecar container, for a pod whose engine publishes its snapshots into the shared
volume (docs/publish-format.md). Include it with this chart's context: in this chart `.`, in a
chart that depends on gpumem `.Subcharts.gpumem`, e.g.
  containers:
    - name: engine
      ...
    {{- include "gpumem.sidecar.container" .Subcharts.gpumem | nindent 4 }}
The pod also needs the volume ("gpumem.sidecar.volume"), shareProcessNamespace: true (so the
sidecar sees the engine's pids) and securityContext.fsGroup: 10001 (so it can read what any
engine user publishes).
*/}}
{{- define "gpumem.sidecar.container" -}}
- name: gpumem
  image: {{ include "gpumem.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["serve", "--listen", "0.0.0.0:9400", "--collect-dir", {{ .Values.sidecar.collectDir | quote }}, "--interval", {{ .Values.sidecar.interval | quote }}]
  env:
    # The pod the sidecar's series belong to, from the downward API.
    - name: GPUMEM_POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: GPUMEM_POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
  ports:
    - name: metrics
      containerPort: 9400
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  # No readinessProbe on purpose: a pod is Ready only when every container is, so a sidecar
  # that cannot sample would take the inference pod out of its Service. The liveness probe
  # restarts a stuck sidecar instead (a missing NVML keeps /healthz 200).
  livenessProbe:
    httpGet:
      path: /healthz
      port: 9400
    initialDelaySeconds: 10
    periodSeconds: 20
    timeoutSeconds: 3
    failureThreshold: 3
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    # Writable: the sidecar removes the files of engines that died (kill -9, OOM kill).
    - name: gpumem-publish
      mountPath: {{ .Values.sidecar.collectDir }}
{{- end }}

{{/* The shared volume of the sidecar shape: small files rewritten every second, kept in memory. */}}
{{- define "gpumem.sidecar.volume" -}}
- name: gpumem-publish
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.sidecar.volumeSizeLimit }}
{{- end }}
