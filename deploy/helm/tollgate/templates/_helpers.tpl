{{- /* The labels of every object of a release, and its selector. */ -}}
{{- define "tollgate.labels" -}}
app.kubernetes.io/name: tollgate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /* The labels of the bundled Redis. */ -}}
{{- define "tollgate.redisLabels" -}}
app.kubernetes.io/name: tollgate-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
