{{/* Chart name. */}}
{{- define "sandbox-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the objects: <release>-sandbox-operator, or the release name when it already
contains the chart name. Truncated to 63 characters (DNS label).
*/}}
{{- define "sandbox-operator.fullname" -}}
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

{{/* Name of cluster-scoped objects: the namespace is part of it, so two releases of the same
name in different namespaces do not collide. */}}
{{- define "sandbox-operator.clusterName" -}}
{{- printf "%s-%s" (include "sandbox-operator.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "sandbox-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sandbox-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandbox-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sandbox-operator.labels" -}}
helm.sh/chart: {{ include "sandbox-operator.chart" . }}
{{ include "sandbox-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandbox-operator
{{- end }}

{{- define "sandbox-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sandbox-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator instance: .Values.instance, else the release name. */}}
{{- define "sandbox-operator.instance" -}}
{{- default .Release.Name .Values.instance }}
{{- end }}

{{/* The leader-election Lease the operator holds (src/leader.rs: sandbox-operator-<instance>). */}}
{{- define "sandbox-operator.leaseName" -}}
{{- printf "sandbox-operator-%s" (include "sandbox-operator.instance" .) }}
{{- end }}

{{- define "sandbox-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* --metrics-addr: IPv6 addresses need brackets. */}}
{{- define "sandbox-operator.metricsAddr" -}}
{{- $host := .Values.metrics.bindAddress }}
{{- if contains ":" $host }}
{{- printf "[%s]:%d" $host (int .Values.metrics.port) }}
{{- else }}
{{- printf "%s:%d" $host (int .Values.metrics.port) }}
{{- end }}
{{- end }}

{{/*
Environment variable names that carry credentials from Secrets into the operator. Derived from
list positions, so they are always valid names: providers[i] -> SANDBOX_SECRET_PROVIDER_<i>_*,
templateStores[i] -> SANDBOX_SECRET_STORE_<i>_*.
*/}}
{{- define "sandbox-operator.providerSecretEnv" -}}
{{- printf "SANDBOX_SECRET_PROVIDER_%d_%s" (int .index) .what }}
{{- end }}
{{- define "sandbox-operator.storeSecretEnv" -}}
{{- printf "SANDBOX_SECRET_STORE_%d_%s" (int .index) .what }}
{{- end }}

{{/* Where the i-th Docker provider's socket is mounted inside the container. */}}
{{- define "sandbox-operator.dockerSocketPath" -}}
{{- printf "/var/run/sandbox-operator/docker-%d.sock" (int .) }}
{{- end }}

{{/*
The operator configuration file (src/config.rs), rendered from the values. Secrets appear only
as {env: NAME} references; the values come from secretKeyRef in the Deployment.
*/}}
{{- define "sandbox-operator.config" -}}
{{- $cfg := dict "instance" (include "sandbox-operator.instance" .) }}
{{- if .Values.defaultProvider }}
{{- $_ := set $cfg "defaultProvider" .Values.defaultProvider }}
{{- end }}
{{- $_ := set $cfg "resyncSecs" (int .Values.resyncSecs) }}
{{- $_ := set $cfg "providerConcurrency" (int .Values.providerConcurrency) }}
{{- $_ := set $cfg "providerTimeoutSecs" (int .Values.providerTimeoutSecs) }}
{{- if kindIs "slice" .Values.openImages }}
{{- $_ := set $cfg "openImages" .Values.openImages }}
{{- end }}
{{- $providers := list }}
{{- range $i, $p := .Values.providers }}
{{- $out := dict "name" $p.name "type" $p.type }}
{{- if $p.templateStore }}
{{- $_ := set $out "templateStore" $p.templateStore }}
{{- end }}
{{- if eq $p.type "docker" }}
{{- $d := default (dict) $p.docker }}
{{- $docker := dict }}
{{- if $d.host }}
{{- $_ := set $docker "endpoint" $d.host }}
{{- else }}
{{- $_ := set $docker "endpoint" (printf "unix://%s" (include "sandbox-operator.dockerSocketPath" $i)) }}
{{- end }}
{{- range $key := list "publishHost" "defaultImage" "templateRepository" "imagePullTimeoutSeconds" "allowPlainTcp" "runtime" "hardening" "egress" "defaults" }}
{{- if index $d $key }}
{{- $_ := set $docker $key (index $d $key) }}
{{- end }}
{{- end }}
{{- /* The host firewall's helper image (values: dockerFirewallImage), unless opted out. */}}
{{- $hardening := deepCopy (default (dict) $d.hardening) }}
{{- if and (ne (toString $hardening.hostFirewall) "off") (not $hardening.firewallImage) }}
{{- $_ := set $hardening "firewallImage" $.Values.dockerFirewallImage }}
{{- end }}
{{- $_ := set $docker "hardening" $hardening }}
{{- $_ := set $out "docker" $docker }}
{{- else if eq $p.type "fly" }}
{{- $f := $p.fly }}
{{- $fly := dict "app" $f.app "token" (dict "env" (include "sandbox-operator.providerSecretEnv" (dict "index" $i "what" "TOKEN"))) }}
{{- range $key := list "org" "region" "apiUrl" "publicHost" "firstPublicPort" "lastPublicPort" "defaultImage" "driftIntervalSeconds" "leaseTtlSeconds" "network" }}
{{- if index $f $key }}
{{- $_ := set $fly $key (index $f $key) }}
{{- end }}
{{- end }}
{{- $_ := set $out "fly" $fly }}
{{- else if eq $p.type "e2b" }}
{{- $e := $p.e2b }}
{{- $e2b := dict "apiKey" (dict "env" (include "sandbox-operator.providerSecretEnv" (dict "index" $i "what" "API_KEY"))) }}
{{- range $key := list "apiUrl" "sandboxUrl" "domain" "template" "timeoutSecs" "watchIntervalSecs" "onTimeout" "user" }}
{{- if index $e $key }}
{{- $_ := set $e2b $key (index $e $key) }}
{{- end }}
{{- end }}
{{- $_ := set $out "e2b" $e2b }}
{{- else if eq $p.type "sprites" }}
{{- $sp := $p.sprites }}
{{- $sprites := dict "org" $sp.org "token" (dict "env" (include "sandbox-operator.providerSecretEnv" (dict "index" $i "what" "TOKEN"))) }}
{{- if $sp.apiUrl }}
{{- $_ := set $sprites "apiUrl" $sp.apiUrl }}
{{- end }}
{{- $_ := set $out "sprites" $sprites }}
{{- else if eq $p.type "kubernetes" }}
{{- $k := default (dict) $p.kubernetes }}
{{- $kubernetes := dict "namespace" (include "sandbox-operator.podNamespace" $p) }}
{{- range $key := list "runtimeClassName" "runAsUser" "portAddress" "storageClassName" "volumeSize" "hostPathVolumes" "defaultResources" "networkPolicy" }}
{{- if index $k $key }}
{{- $_ := set $kubernetes $key (index $k $key) }}
{{- end }}
{{- end }}
{{- $_ := set $out "kubernetes" $kubernetes }}
{{- end }}
{{- $providers = append $providers $out }}
{{- end }}
{{- $_ := set $cfg "providers" $providers }}
{{- $stores := list }}
{{- range $i, $s := .Values.templateStores }}
{{- $out := dict "name" $s.name "bucket" $s.bucket }}
{{- range $key := list "endpoint" "region" "prefix" }}
{{- if index $s $key }}
{{- $_ := set $out $key (index $s $key) }}
{{- end }}
{{- end }}
{{- if hasKey $s "pathStyle" }}
{{- $_ := set $out "pathStyle" $s.pathStyle }}
{{- end }}
{{- with $s.credentials }}
{{- $_ := set $out "accessKeyId" (dict "env" (include "sandbox-operator.storeSecretEnv" (dict "index" $i "what" "ACCESS_KEY_ID"))) }}
{{- $_ := set $out "secretAccessKey" (dict "env" (include "sandbox-operator.storeSecretEnv" (dict "index" $i "what" "SECRET_ACCESS_KEY"))) }}
{{- if .sessionTokenKey }}
{{- $_ := set $out "sessionToken" (dict "env" (include "sandbox-operator.storeSecretEnv" (dict "index" $i "what" "SESSION_TOKEN"))) }}
{{- end }}
{{- end }}
{{- $stores = append $stores $out }}
{{- end }}
{{- if $stores }}
{{- $_ := set $cfg "templateStores" $stores }}
{{- end }}
{{- $sw := .Values.sweeper }}
{{- $_ := set $cfg "sweeper" (dict "enabled" $sw.enabled "intervalSecs" (int $sw.intervalSecs) "graceSecs" (int $sw.graceSecs) "dryRun" $sw.dryRun "maxDeletionsPerPass" (int $sw.maxDeletionsPerPass)) }}
{{- if .Values.access.enabled }}
{{- $_ := set $cfg "access" (dict "enabled" true "address" (printf "0.0.0.0:%d" (int .Values.access.port)) "tlsCertFile" "/etc/sandbox-operator-access/tls.crt" "tlsKeyFile" "/etc/sandbox-operator-access/tls.key" "maxUploadBytes" (int64 .Values.access.maxUploadBytes)) }}
{{- end }}
{{- if (.Values.e2bApi).enabled }}
{{- $e2b := dict "enabled" true "address" (printf "0.0.0.0:%d" (int .Values.e2bApi.port)) "templates" (.Values.e2bApi.templates | default dict) }}
{{- if .Values.e2bApi.domain }}{{- $_ := set $e2b "domain" .Values.e2bApi.domain }}{{- end }}
{{- if (.Values.e2bApi.accessTokenKey).secretName }}{{- $_ := set $e2b "accessTokenKeyFile" "/etc/sandbox-operator-e2b/token-key" }}{{- end }}
{{- $_ := set $cfg "e2bApi" $e2b }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* secretKeyRef environment variables for every credential the configuration references. */}}
{{- define "sandbox-operator.secretEnv" -}}
{{- range $i, $p := .Values.providers }}
{{- if eq $p.type "fly" }}
- name: {{ include "sandbox-operator.providerSecretEnv" (dict "index" $i "what" "TOKEN") }}
  valueFrom:
    secretKeyRef:
      name: {{ $p.fly.token.secretName }}
      key: {{ $p.fly.token.key }}
{{- else if eq $p.type "e2b" }}
- name: {{ include "sandbox-operator.providerSecretEnv" (dict "index" $i "what" "API_KEY") }}
  valueFrom:
    secretKeyRef:
      name: {{ $p.e2b.apiKey.secretName }}
      key: {{ $p.e2b.apiKey.key }}
{{- else if eq $p.type "sprites" }}
- name: {{ include "sandbox-operator.providerSecretEnv" (dict "index" $i "what" "TOKEN") }}
  valueFrom:
    secretKeyRef:
      name: {{ $p.sprites.token.secretName }}
      key: {{ $p.sprites.token.key }}
{{- end }}
{{- end }}
{{- range $i, $s := .Values.templateStores }}
{{- with $s.credentials }}
- name: {{ include "sandbox-operator.storeSecretEnv" (dict "index" $i "what" "ACCESS_KEY_ID") }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .accessKeyIdKey }}
- name: {{ include "sandbox-operator.storeSecretEnv" (dict "index" $i "what" "SECRET_ACCESS_KEY") }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .secretAccessKeyKey }}
{{- if .sessionTokenKey }}
- name: {{ include "sandbox-operator.storeSecretEnv" (dict "index" $i "what" "SESSION_TOKEN") }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .sessionTokenKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The namespace of a kubernetes provider's sandbox Pods (its `kubernetes.namespace`, default
`sandboxes`), given the provider entry.
*/}}
{{- define "sandbox-operator.podNamespace" -}}
{{- $k := default (dict) .kubernetes -}}
{{- default "sandboxes" $k.namespace -}}
{{- end }}

{{/*
The TCP port of a URL (tcp://h:2376, https://h, http://h:9000): its explicit port, else 80
for http and 443 for everything else.
*/}}
{{- define "sandbox-operator.urlPort" -}}
{{- $u := urlParse . -}}
{{- $hostport := splitList ":" $u.host -}}
{{- if gt (len $hostport) 1 -}}
{{- last $hostport -}}
{{- else if eq $u.scheme "http" -}}
80
{{- else -}}
443
{{- end -}}
{{- end }}
