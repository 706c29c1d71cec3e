"""The local runtime (the embedded default): one Flink cluster per app, as JVMs on this host.

  runtime.py    `LocalRuntime`: cluster lifecycle, observe, drift; mixes in the two below
  processes.py  the JVMs of a cluster: start a JobManager and N TaskManagers, scale, wait, stop
  standby.py    the warm standby: a second cluster at the new spec, started before the old job stops
  config.py     the pure half: the Flink distribution on disk, the generated config.yaml, a cluster's record
"""
