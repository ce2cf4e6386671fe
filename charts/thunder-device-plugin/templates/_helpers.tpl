{{/* Names and labels shared by every template. */}}

{{- define "tdp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tdp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Labels on everything the chart creates. app.kubernetes.io/name is the driver's own
name (thunder-dra-driver) on every object, as on what the operator writes at runtime,
so one selector finds all of it.
*/}}
{{- define "tdp.labels" -}}
app.kubernetes.io/name: thunder-dra-driver
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: thunder-device-plugin
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "tdp.operatorSelectorLabels" -}}
app.kubernetes.io/name: thunder-dra-driver
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "tdp.operatorName" -}}
{{- printf "%s-operator" (include "tdp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tdp.operatorServiceAccount" -}}
{{- if .Values.serviceAccount.operator.create -}}
{{- default (include "tdp.operatorName" .) .Values.serviceAccount.operator.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.operator.name -}}
{{- end -}}
{{- end -}}

{{- define "tdp.daemonServiceAccount" -}}
{{- if .Values.serviceAccount.daemon.create -}}
{{- default (printf "%s-daemon" (include "tdp.fullname" .) | trunc 63 | trimSuffix "-") .Values.serviceAccount.daemon.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.daemon.name -}}
{{- end -}}
{{- end -}}

{{- define "tdp.webhookService" -}}
{{- printf "%s-webhook" (include "tdp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The webhook's serving certificate Secret: webhook.tls.existingSecret, or the chart's own. */}}
{{- define "tdp.webhookSecret" -}}
{{- if .Values.webhook.tls.existingSecret -}}
{{- .Values.webhook.tls.existingSecret -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "tdp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tdp.webhookConfiguration" -}}
{{- printf "%s-%s" (include "tdp.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tdp.metricsService" -}}
{{- printf "%s-metrics" (include "tdp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Lease (in the release namespace) the operator replicas elect their leader through. */}}
{{- define "tdp.leaseName" -}}
{{- include "tdp.fullname" . -}}
{{- end -}}

{{- define "tdp.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/*
The webhook's serving certificate when the chart generates it: the Secret from an
earlier release is reused as long as it holds a CA and a key pair, so upgrades keep
the certificate (and the operator keeps serving) and only a first install, or a
deleted Secret, mints a new CA. Both keys are ECDSA P-256, as the cert-manager
Certificate asks for (and an RSA key costs most of a render's time). Computed once per
render and cached, so the Secret, the webhook configuration's caBundle and the
Deployment's checksum agree.
With webhook.tls.existingSecret the certificate is the user's: nothing is generated or
looked up, so every render (`helm template` included) is the same; "ca" is
webhook.tls.caBundle, and "crt", which only feeds the Deployment's checksum, is that
CA too, so a new CA rolls the operator onto the new Secret.
Result: a dict with base64 "ca", "crt" and "key".
*/}}
{{- define "tdp.webhookTLS" -}}
{{- if not (hasKey .Values "__webhookTLS") -}}
{{- if .Values.webhook.tls.existingSecret -}}
{{- if .Values.webhook.certManager.enabled -}}
{{- fail "webhook.tls.existingSecret and webhook.certManager.enabled: choose one source of the webhook's certificate" -}}
{{- end -}}
{{- if not .Values.webhook.tls.caBundle -}}
{{- fail (printf "webhook.tls.caBundle: required with webhook.tls.existingSecret; set it to the base64 PEM of the CA that signed %s's certificate (for a Secret that holds it: kubectl -n %s get secret %s -o jsonpath='{.data.ca\\.crt}')" .Values.webhook.tls.existingSecret .Release.Namespace .Values.webhook.tls.existingSecret) -}}
{{- end -}}
{{- $_ := set .Values "__webhookTLS" (dict "ca" .Values.webhook.tls.caBundle "crt" .Values.webhook.tls.caBundle "key" "") -}}
{{- else -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "tdp.webhookSecret" .) -}}
{{- $data := dict -}}
{{- if and $secret $secret.data -}}
{{- $data = $secret.data -}}
{{- end -}}
{{- $tls := dict -}}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") -}}
{{- $tls = dict "ca" (index $data "ca.crt") "crt" (index $data "tls.crt") "key" (index $data "tls.key") -}}
{{- else -}}
{{- $svc := include "tdp.webhookService" . -}}
{{- $ns := .Release.Namespace -}}
{{- $days := int .Values.webhook.certValidityDays -}}
{{- $ca := genCAWithKey (printf "%s-webhook-ca" (include "tdp.fullname" .)) $days (genPrivateKey "ecdsa") -}}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) -}}
{{- $cert := genSignedCertWithKey (printf "%s.%s.svc" $svc $ns) nil $dns $days $ca (genPrivateKey "ecdsa") -}}
{{- $tls = dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) -}}
{{- end -}}
{{- $_ := set .Values "__webhookTLS" $tls -}}
{{- end -}}
{{- end -}}
{{- toYaml (get .Values "__webhookTLS") -}}
{{- end -}}

{{/*
Seconds in a Go-style duration such as "90s", "1h30m" or "1.5h" (the values schema
has already checked the syntax).
*/}}
{{- define "tdp.durationSeconds" -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|ms|s|m|h)" . -1 -}}
{{- $unit := regexFind "(ns|us|ms|s|m|h)$" . -}}
{{- $number := trimSuffix $unit . | float64 -}}
{{- $total = addf $total (mulf $number (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
The checks the validating webhook makes on a ThunderCluster that the values schema
cannot express. The chart's own ThunderCluster CREATE is not sent to the webhook (the
operator is not serving yet during `helm install`), so the chart makes them itself.
*/}}
{{- define "tdp.checkValues" -}}
{{- $bounds := list (list "operator.reconcileInterval" .Values.operator.reconcileInterval 5.0 86400.0 "5s" "24h") (list "operator.orphanGracePeriod" .Values.operator.orphanGracePeriod 30.0 604800.0 "30s" "168h") -}}
{{- range $bounds -}}
{{- $seconds := include "tdp.durationSeconds" (index . 1) | float64 -}}
{{- if or (lt $seconds (index . 2)) (gt $seconds (index . 3)) -}}
{{- fail (printf "%s: must be between %s and %s, got %q" (index . 0) (index . 4) (index . 5) (index . 1)) -}}
{{- end -}}
{{- end -}}
{{- $ports := .Values.daemon.thunderdPortRange -}}
{{- if lt (sub (int $ports.end) (int $ports.start)) 1 -}}
{{- fail (printf "daemon.thunderdPortRange: must hold at least 2 ports with end >= start, got %v-%v" $ports.start $ports.end) -}}
{{- end -}}
{{- end -}}
