{{/* Names, labels and the shared pieces of the Lifeguard chart. */}}

{{- define "lifeguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every resource name. Kept to 40 characters so "-operator-config" still fits. */}}
{{- define "lifeguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. part-of=lifeguard also keeps the webhook off Lifeguard's own pods. */}}
{{- define "lifeguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "lifeguard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lifeguard
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "operator"). */}}
{{- define "lifeguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lifeguard.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "lifeguard.componentLabels" -}}
{{ include "lifeguard.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "lifeguard.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "lifeguard.operatorService" -}}
{{- printf "%s-operator" (include "lifeguard.fullname" .) -}}
{{- end -}}

{{- define "lifeguard.webhookService" -}}
{{- printf "%s-webhook" (include "lifeguard.fullname" .) -}}
{{- end -}}

{{/* Name of the operator's TLS Secret (it also holds ca.crt, which the operator distributes). */}}
{{- define "lifeguard.operatorTlsSecret" -}}
{{- include "lifeguard.validateValues" . -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- .Values.certificates.existingSecret.operatorSecretName -}}
{{- else -}}
{{- printf "%s-operator-tls" (include "lifeguard.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "lifeguard.webhookTlsSecret" -}}
{{- include "lifeguard.validateValues" . -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- .Values.certificates.existingSecret.webhookSecretName -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "lifeguard.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The DNS names a Service's certificate must carry; call with (dict "root" $ "service" NAME). */}}
{{- define "lifeguard.dnsNames" -}}
{{- $ns := .root.Release.Namespace -}}
{{- list .service (printf "%s.%s" .service $ns) (printf "%s.%s.svc" .service $ns) (printf "%s.%s.svc.%s" .service $ns .root.Values.clusterDomain) | toJson -}}
{{- end -}}

{{/*
The generated certificates (certificates.mode=generated), as JSON:
{"ca": PEM, "operator": {"crt", "key"}, "webhook": {"crt", "key"}}, all base64.
On upgrade, `lookup` finds the Secrets of the previous release and keeps them (both must exist,
be complete and share one CA); otherwise a new ECDSA P-256 CA signs both serving certificates.
`helm template` and `--dry-run` cannot look anything up, so they always show new certificates.
The result is memoized in .Values so every template of one render sees the same certificates.
*/}}
{{- define "lifeguard.generatedTls" -}}
{{- if not (hasKey .Values "_lifeguardGeneratedTls") -}}
{{- $ns := .Release.Namespace -}}
{{- $operator := lookup "v1" "Secret" $ns (include "lifeguard.operatorTlsSecret" .) -}}
{{- $webhook := lookup "v1" "Secret" $ns (include "lifeguard.webhookTlsSecret" .) -}}
{{- $keep := false -}}
{{- if and $operator $webhook -}}
{{- $od := default dict $operator.data -}}
{{- $wd := default dict $webhook.data -}}
{{- if and (index $od "tls.crt") (index $od "tls.key") (index $od "ca.crt") (index $wd "tls.crt") (index $wd "tls.key") (eq (index $od "ca.crt") (index $wd "ca.crt" | default "")) -}}
{{- $keep = true -}}
{{- end -}}
{{- end -}}
{{- $tls := dict -}}
{{- if $keep -}}
{{- $_ := set $tls "ca" (index $operator.data "ca.crt") -}}
{{- $_ := set $tls "operator" (dict "crt" (index $operator.data "tls.crt") "key" (index $operator.data "tls.key")) -}}
{{- $_ := set $tls "webhook" (dict "crt" (index $webhook.data "tls.crt") "key" (index $webhook.data "tls.key")) -}}
{{- else -}}
{{- $days := int .Values.certificates.generated.validityDays -}}
{{- $caKey := genPrivateKey "ecdsa" -}}
{{- $ca := genCAWithKey (printf "%s-ca" (include "lifeguard.fullname" .)) $days $caKey -}}
{{- $_ := set $tls "ca" ($ca.Cert | b64enc) -}}
{{- range $component := list "operator" "webhook" -}}
{{- $service := printf "%s-%s" (include "lifeguard.fullname" $) $component -}}
{{- $dns := include "lifeguard.dnsNames" (dict "root" $ "service" $service) | fromJsonArray -}}
{{- $cert := genSignedCertWithKey (printf "%s.%s.svc" $service $ns) nil $dns $days $ca (genPrivateKey "ecdsa") -}}
{{- $_ := set $tls $component (dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set .Values "_lifeguardGeneratedTls" $tls -}}
{{- end -}}
{{- index .Values "_lifeguardGeneratedTls" | toJson -}}
{{- end -}}

{{/* base64 caBundle for the webhook configurations; empty in certManager mode (cert-manager injects it). */}}
{{- define "lifeguard.caBundle" -}}
{{- if eq .Values.certificates.mode "generated" -}}
{{- (include "lifeguard.generatedTls" . | fromJson).ca -}}
{{- else if eq .Values.certificates.mode "existingSecret" -}}
{{- include "lifeguard.validateValues" . -}}
{{- $pem := .Values.certificates.existingSecret.caBundle -}}
{{- if not (contains "-----BEGIN CERTIFICATE-----" $pem) -}}
{{- fail "certificates.existingSecret.caBundle must be a PEM certificate (-----BEGIN CERTIFICATE-----), not base64 or a file name" -}}
{{- end -}}
{{- $pem | b64enc -}}
{{- end -}}
{{- end -}}

{{/* Annotations of the webhook configurations (cert-manager's CA injection). */}}
{{- define "lifeguard.webhookConfigAnnotations" -}}
{{- if eq .Values.certificates.mode "certManager" -}}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "lifeguard.webhookTlsSecret" .) }}
{{- end -}}
{{- end -}}

{{/* The webhooks' namespaceSelector: never kube-system, the release namespace or excludeNamespaces. */}}
{{- define "lifeguard.webhookNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- range (concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces) | uniq }}
        - {{ . | quote }}
        {{- end }}
{{- end -}}

{{/* The hardened container securityContext every Lifeguard container runs with. */}}
{{- define "lifeguard.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  allowPrivilegeEscalation: false
  privileged: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "lifeguard.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* Preferred or required anti-affinity over nodes; call with (dict "root" $ "component" C "hard" BOOL). */}}
{{- define "lifeguard.antiAffinity" -}}
podAntiAffinity:
{{- if .hard }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "lifeguard.selectorLabels" . | nindent 10 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "lifeguard.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end -}}

{{/*
Value combinations values.schema.json cannot express. Included by every helper that depends on
them, so whichever template renders first reports the same message.
*/}}
{{- define "lifeguard.validateValues" -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- $missing := list -}}
{{- range $key := list "operatorSecretName" "webhookSecretName" "caBundle" -}}
{{- if not (index $.Values.certificates.existingSecret $key) -}}
{{- $missing = append $missing $key -}}
{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "certificates.mode existingSecret needs certificates.existingSecret.operatorSecretName, webhookSecretName and caBundle (the PEM CA that signed the webhook's certificate); missing: %s" (join ", " $missing)) -}}
{{- end -}}
{{- end -}}
{{- if eq (int .Values.sidecar.adminPort) (int .Values.sidecar.upstreamPort) -}}
{{- fail "sidecar.adminPort and sidecar.upstreamPort must differ: the sidecar's admin listener and the MCP container's loopback port share the pod's network namespace" -}}
{{- end -}}
{{- if has (int .Values.sidecar.internalPort) (list (int .Values.sidecar.adminPort) (int .Values.sidecar.upstreamPort)) -}}
{{- fail "sidecar.internalPort must differ from sidecar.adminPort and sidecar.upstreamPort: the sidecar's internal hop shares the pod's network namespace with both" -}}
{{- end -}}
{{- if and (eq .Values.certificates.mode "certManager") .Values.certificates.certManager.issuerRef (not .Values.certificates.certManager.issuerRef.name) -}}
{{- fail "certificates.certManager.issuerRef needs a name (and usually kind and group), or leave it empty for the chart's own CA" -}}
{{- end -}}
{{- end -}}

{{/*
The standard OTEL_* variables of the operator and webhook containers (values `otel.*`); nothing
when no endpoint is set. `service` is the default service.name.
*/}}
{{- define "lifeguard.otelEnv" -}}
{{- with .Values.otel }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
{{- with .sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with .samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)"
{{- end }}
{{- end }}
{{- end -}}
