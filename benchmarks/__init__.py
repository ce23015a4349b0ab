"""The benchmarks, one folder each (script, results, README); run from the checkout's root as modules,
`python -m benchmarks.<folder>.<script>`, so that they import this checkout's tfdml and each other."""
