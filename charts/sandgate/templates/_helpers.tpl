{{/* The object name: the release name when it says sandgate, else release-sandgate. */}}
{{- define "sandgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- include "sandgate.fit" (list .Values.fullnameOverride 63) -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- include "sandgate.fit" (list .Release.Name 63) -}}
{{- else -}}
{{- include "sandgate.fit" (list (printf "%s-%s" .Release.Name .Chart.Name) 63) -}}
{{- end -}}
{{- end -}}

{{/*
(list NAME MAX): NAME when it fits in MAX characters, else its first characters, "-" and 16 hex
digits of its SHA-256: two names cut to one prefix never become one name.
*/}}
{{- define "sandgate.fit" -}}
{{- $name := index . 0 }}{{ $max := index . 1 -}}
{{- if le (len $name) $max -}}
{{- $name -}}
{{- else -}}
{{- printf "%s-%s" ($name | trunc (int (sub $max 17)) | trimSuffix "-") (sha256sum $name | trunc 16) -}}
{{- end -}}
{{- end -}}

{{/*
(list . SUFFIX): the name of a cluster-scoped object of this release: fullname, release
namespace and SUFFIX. Releases in different namespaces get different names, and it is never
cut (at most 63 + 63 + the suffix, well within the 253 characters of a DNS subdomain).
*/}}
{{- define "sandgate.clusterName" -}}
{{- $ := index . 0 -}}
{{- printf "%s-%s-%s" (include "sandgate.fullname" $) $.Release.Namespace (index . 1) -}}
{{- end -}}

{{/* Labels that select Sandgate's pods; the config's kubernetes.sandgate.pod_selector too. */}}
{{- define "sandgate.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sandgate.labels" -}}
{{ include "sandgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sandgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "sandgate.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "sandgate.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- /* True when the policies come from a signed bundle (policies.bundle), not a ConfigMap. */}}
{{- define "sandgate.policyBundle" -}}
{{- if or .Values.policies.bundle.url .Values.policies.bundle.oci }}true{{ end -}}
{{- end -}}

{{- define "sandgate.policiesConfigMap" -}}
{{- .Values.policies.existingConfigMap | default (printf "%s-policies" (include "sandgate.fullname" .)) -}}
{{- end -}}

{{/*
Sandgate's config file: structured defaults from the values, then .Values.config merged over
them key by key (lists replaced). Credentials from Secrets come first in config.credentials,
followed by any the user lists in config.credentials (env-backed ones, for example).
*/}}
{{- define "sandgate.config" -}}
{{- $full := include "sandgate.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $creds := list -}}
{{- range .Values.credentials -}}
{{- $creds = append $creds (dict "name" .name "file" (printf "/etc/sandgate/credentials/%s/%s" .name .key)) -}}
{{- end -}}
{{- $audit := dict "file" (dict "dir" "/var/lib/sandgate/audit") -}}
{{- with .Values.audit.tamperEvidence -}}
{{- if .enabled -}}
{{- $_ := set $audit "chain_key_credential" "audit-chain-key" -}}
{{- $_ := set $audit "checkpoint" (dict "signing_key_credential" "audit-signing-key" "every_events" (int .checkpoint.everyEvents) "every" .checkpoint.every) -}}
{{- $creds = append $creds (dict "name" "audit-chain-key" "file" "/etc/sandgate/audit-keys/chain.key") -}}
{{- $creds = append $creds (dict "name" "audit-signing-key" "file" "/etc/sandgate/audit-keys/checkpoint.key") -}}
{{- end -}}
{{- end -}}
{{- with .Values.audit.otlp -}}
{{- if .endpoint -}}
{{- $o := dict "endpoint" .endpoint "protocol" .protocol "insecure" .insecure -}}
{{- if .headers }}{{ $_ := set $o "headers" .headers }}{{ end -}}
{{- if .authSecret.name -}}
{{- $ref := dict "name" "audit-otlp-auth" "header" .authSecret.header -}}
{{- if .authSecret.format }}{{ $_ := set $ref "format" .authSecret.format }}{{ end -}}
{{- $_ := set $o "header_credential" $ref -}}
{{- $creds = append $creds (dict "name" "audit-otlp-auth" "file" (printf "/etc/sandgate/credentials/audit-otlp-auth/%s" .authSecret.key)) -}}
{{- end -}}
{{- $_ := set $audit "otlp" $o -}}
{{- end -}}
{{- end -}}
{{- $policy := dict "dir" "/etc/sandgate/policies" -}}
{{- with .Values.policies.decisionLog -}}
{{- if .enabled -}}
{{- $dl := dict "file" "/var/lib/sandgate/audit/decisions/decisions.log" "max_size_mb" (int .maxSizeMB) "max_files" (int .maxFiles) -}}
{{- if kindIs "slice" .mask }}{{ $_ := set $dl "mask" .mask }}{{ end -}}
{{- $_ := set $policy "decision_log" $dl -}}
{{- end -}}
{{- end -}}
{{- $hosts := list $full (printf "%s.%s" $full $ns) (printf "%s.%s.svc" $full $ns) (printf "%s.%s.svc.%s" $full $ns .Values.clusterDomain) -}}
{{- $kube := dict
  "enabled" .Values.kubernetes.enabled
  "namespaces" .Values.sandboxNamespaces
  "sandgate" (dict
    "namespace" $ns
    "pod_selector" (include "sandgate.selectorLabels" . | fromYaml)
    "ports" (dict "mcp" (int .Values.ports.mcp) "proxy" (int .Values.ports.proxy) "admin" (int .Values.ports.admin)))
  "dns" (dict "allow" .Values.kubernetes.dns)
  "ingress_from" .Values.kubernetes.ingressFrom
  "monitoring" .Values.kubernetes.monitoring
  "controller" (dict "enabled" (and .Values.kubernetes.enabled .Values.kubernetes.controller)) -}}
{{- $base := dict
  "listen" (dict
    "mcp" (printf ":%d" (int .Values.ports.mcp))
    "proxy" (printf ":%d" (int .Values.ports.proxy))
    "admin" (printf ":%d" (int .Values.ports.admin)))
  "policy" $policy
  "audit" $audit
  "gateway" (dict "allowed_hosts" $hosts)
  "shutdown" (dict "delay" (printf "%ds" (int .Values.shutdown.delaySeconds)) "drain" (printf "%ds" (int .Values.shutdown.drainSeconds)))
  "kubernetes" $kube
  "log" (dict "format" "json" "level" "info") -}}
{{- with .Values.policies.bundle -}}
{{- if or .url .oci -}}
{{- $b := dict "public_key_file" (printf "/etc/sandgate/bundle-key/%s" .publicKeySecret.key) "key_id" .keyId "algorithm" .algorithm "poll_interval" .pollInterval -}}
{{- if .url }}{{ $_ := set $b "url" .url }}{{ else }}{{ $_ := set $b "oci" .oci }}{{ end -}}
{{- $_ := unset $policy "dir" -}}
{{- $_ := set $policy "bundle" $b -}}
{{- end -}}
{{- end -}}
{{- if .Values.ca.secretName -}}
{{- $_ := set $base "proxy" (dict "ca" (dict "cert" "/etc/sandgate/ca/ca.crt" "key" "/etc/sandgate/ca/ca.key")) -}}
{{- end -}}
{{- range .Values.mintedCredentials -}}
{{- $creds = append $creds . -}}
{{- end -}}
{{- with .Values.runTokens -}}
{{- if .issuer -}}
{{- $rt := dict "issuer" .issuer "key_credential" .keyCredential "lifetime" .lifetime -}}
{{- if .jwksSecret }}{{ $_ := set $rt "jwks_secret" (dict "namespace" $ns "name" .jwksSecret) }}{{ end -}}
{{- $_ := set $base "run_tokens" $rt -}}
{{- end -}}
{{- end -}}
{{- $user := deepCopy (.Values.config | default dict) -}}
{{- $userCreds := get $user "credentials" | default list -}}
{{- $merged := mergeOverwrite $base $user -}}
{{- $all := concat $creds $userCreds -}}
{{- if $all -}}
{{- $_ := set $merged "credentials" $all -}}
{{- else -}}
{{- $_ := unset $merged "credentials" -}}
{{- end -}}
{{- toYaml $merged -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: the shutdown's delay and drain, plus 10 s for the audit log's
flush and the process's exit; a value set shorter than that fails the rendering.
*/}}
{{- define "sandgate.terminationGrace" -}}
{{- $need := add (int .Values.shutdown.delaySeconds) (int .Values.shutdown.drainSeconds) 10 -}}
{{- $set := .Values.terminationGracePeriodSeconds -}}
{{- if and (not (kindIs "invalid" $set)) (lt (int $set) (int $need)) -}}
{{- fail (printf "terminationGracePeriodSeconds %d is shorter than shutdown.delaySeconds + shutdown.drainSeconds + 10 (%d): Kubernetes would kill calls still draining and the audit flush" (int $set) (int $need)) -}}
{{- end -}}
{{- if kindIs "invalid" $set }}{{ $need }}{{ else }}{{ int $set }}{{ end -}}
{{- end -}}

{{/*
sandgate.mebibytes is a Kubernetes quantity in whole MiB (Ki, Mi, Gi, Ti, k, M, G, T or bytes);
0 when it cannot tell (a fraction, an exponent).
*/}}
{{- define "sandgate.mebibytes" -}}
{{- $q := toString . -}}
{{- $units := list (list "Ti" 1099511627776) (list "Gi" 1073741824) (list "Mi" 1048576) (list "Ki" 1024) (list "T" 1000000000000) (list "G" 1000000000) (list "M" 1000000) (list "k" 1000) -}}
{{- $bytes := 0 -}}
{{- $found := false -}}
{{- range $units -}}
{{- if and (not $found) (hasSuffix (index . 0) $q) (regexMatch "^[0-9]+$" (trimSuffix (index . 0) $q)) -}}
{{- $bytes = mul (trimSuffix (index . 0) $q | int64) (index . 1) -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if and (not $found) (regexMatch "^[0-9]+$" $q) }}{{ $bytes = $q | int64 }}{{ end -}}
{{- div $bytes 1048576 -}}
{{- end -}}

{{/*
sandgate.checkReserve fails a rendering whose audit reserve (config.audit.file.reserve_mb,
default 32) does not fit the audit volume, alone or with the decision log that shares it
(policies.decisionLog): serve would never become ready, or the log would fill the volume.
*/}}
{{- define "sandgate.checkReserve" -}}
{{- $reserve := int (dig "audit" "file" "reserve_mb" 32 (.Values.config | default dict)) -}}
{{- $size := .Values.audit.emptyDir.sizeLimit -}}
{{- if .Values.audit.persistence.enabled }}{{ $size = .Values.audit.persistence.size }}{{ end -}}
{{- $volume := include "sandgate.mebibytes" $size | int -}}
{{- if and (gt $volume 0) (ge $reserve $volume) -}}
{{- fail (printf "config.audit.file.reserve_mb (%d MiB) does not fit the audit volume (%s): set it well below the volume's size, or make the volume larger" $reserve (toString $size)) -}}
{{- end -}}
{{- $dl := .Values.policies.decisionLog -}}
{{- $dlSize := mul (int $dl.maxSizeMB) (add (int $dl.maxFiles) 1) -}}
{{- if and $dl.enabled (gt $volume 0) (ge (add $reserve $dlSize) $volume) -}}
{{- fail (printf "policies.decisionLog (maxSizeMB × (maxFiles + 1) = %d MiB) and the audit reserve (%d MiB) do not fit the audit volume (%s) they share: lower maxSizeMB or maxFiles, or make the volume larger" $dlSize $reserve (toString $size)) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the audit log's keys: the user's, or the one the chart makes. */}}
{{- define "sandgate.auditKeysSecret" -}}
{{- .Values.audit.tamperEvidence.existingSecret | default (printf "%s-audit-keys" (include "sandgate.fullname" .)) -}}
{{- end -}}
