{{/*
The object name, as 'gpuaccept launch k8s' makes it: the name value (default the release name), at most
48 characters; one starting with a digit gets the prefix "gpuaccept-" (Services need a letter first).
*/}}
{{- define "gpuaccept.name" -}}
{{- $name := .Values.name | default .Release.Name -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "name %q is not a DNS label (lower-case letters, digits and '-'): set name=..." $name) -}}
{{- end -}}
{{- $name = regexReplaceAll "-+$" ($name | trunc 48) "" -}}
{{- if not (regexMatch "^[a-z]" $name) -}}
{{- $name = regexReplaceAll "-+$" (printf "gpuaccept-%s" $name | trunc 48) "" -}}
{{- end -}}
{{- $longest := add (len $name) (len "-node-0-") (len (toString (sub (int .Values.nodes) 1))) -}}
{{- if gt $longest 63 -}}
{{- fail (printf "name %q is too long for %d nodes: pod hostnames would have %d characters (at most 63)" $name (int .Values.nodes) $longest) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* A run id made a label value: at most 63 characters, starting and ending with a letter or digit. */}}
{{- define "gpuaccept.labelValue" -}}
{{- regexReplaceAll "^[^A-Za-z0-9]+|[^A-Za-z0-9]+$" (regexReplaceAll "[^A-Za-z0-9_.-]+" . "-" | trunc 63) "" -}}
{{- end -}}
