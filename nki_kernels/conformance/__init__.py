"""Run AWS's public NKI kernels (nki-library, aws-neuron-sdk examples) in the interpreter.

`loader` imports a checkout's modules unmodified with `nki` mapped to the interpreter;
`runner` runs their kernels against their own references and tabulates the outcome.
"""
