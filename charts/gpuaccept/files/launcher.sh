# gpuaccept: run the job (the arguments), then print its reports to the log.
rc=0
"$@" || rc=$?
dir="${GPUACCEPT_RESULTS_DIR:-}"
if [ -n "$dir" ] && [ -d "$dir" ]; then
  find "$dir" -type f -name report.json | sort | while IFS= read -r f; do
    printf "\n%s %s\n" "@@gpuaccept-report-begin@@" "$f"
    cat "$f"
    printf "\n%s\n" "@@gpuaccept-report-end@@"
  done
fi
exit "$rc"
