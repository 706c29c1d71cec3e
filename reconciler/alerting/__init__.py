"""Alerting: per-app health facts, the conditions they raise, and notifications of them (docs/alerts.md).

Pure, table-tested parts (no I/O, no clock: `now` is passed in):
  facts.py       what a pass observed about an app, folded into one frozen AppFacts (and its phase)
  conditions.py  the triggers (app blocked, crash loop, checkpoint age, ...) and when each is active
  state.py       firing / resend / resolved per (trigger, app): Alertmanager's repeat interval, Argo CD
                 Notifications' "send once per value, and on resolve"
  message.py     what a notification says (JSON, Slack-compatible, e-mail), with nothing secret in it
The shell:
  sinks.py       the only module that talks to the receivers (HTTP webhooks, SMTP)
  delivery.py    one bounded queue and worker per sink: retries with capped backoff, a dropped counter,
                 never blocking a pass
  alerter.py     ties them together for the daemon: fed by each pass, read by the dashboard
"""
