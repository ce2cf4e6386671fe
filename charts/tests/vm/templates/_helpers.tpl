{{/* The DeviceClass of gpu.type: lower-cased, every character outside [a-z0-9] to "-",
runs of "-" collapsed, no "-" at either end (the operator's own rule). */}}
{{- define "thunder.deviceClass" -}}
{{- $lower := .Values.gpu.type | toString | lower -}}
{{- $label := regexReplaceAll "[^a-z0-9]+" $lower "-" | trimAll "-" -}}
{{- if not $label -}}
{{- fail (printf "gpu.type %q has no letters or digits" .Values.gpu.type) -}}
{{- end -}}
{{- printf "%s%s" .Values.gpu.deviceClassPrefix $label -}}
{{- end -}}
