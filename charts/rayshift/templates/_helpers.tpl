{{/* The base name of every object. */}}
{{- define "rayshift.fullname" -}}
{{- default "rayshift" .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "rayshift.labels" -}}
app.kubernetes.io/name: {{ include "rayshift.fullname" . }}
{{- end -}}

{{/* The webhook Service's DNS names, for its serving certificate. */}}
{{- define "rayshift.dnsNames" -}}
{{- $svc := printf "%s-webhook" (include "rayshift.fullname" .) -}}
{{- list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) | toJson -}}
{{- end -}}

{{- define "rayshift.validModes" -}}
{{- if not (has .Values.mode (list "webhook" "observe" "reconcile")) -}}
{{- fail (printf "mode must be webhook, observe or reconcile, not %q" .Values.mode) -}}
{{- end -}}
{{- if not (has .Values.certificates.source (list "cert-manager" "self-signed" "secret")) -}}
{{- fail (printf "certificates.source must be cert-manager, self-signed or secret, not %q" .Values.certificates.source) -}}
{{- end -}}
{{- if and (eq .Values.certificates.source "secret") (not .Values.certificates.caBundle) -}}
{{- fail "certificates.source=secret needs certificates.caBundle (the base64 PEM of the CA that signed the Secret)" -}}
{{- end -}}
{{- end -}}
