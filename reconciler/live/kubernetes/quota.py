"""What a second cluster asks of a namespace's ResourceQuotas, and whether it fits beside what runs.

A warm standby runs beside the live cluster for a while, so it needs quota for a whole second cluster.
Kubernetes would refuse its pods and the standby would only wait for its deadline; checking first lets
the plan fall back to a cold upgrade and say why. Pure: the quotas come from one list per namespace.
"""

from __future__ import annotations

from reconciler.live.kubernetes.render import Obj

_QUANTITY_SUFFIX = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity as a number ("500m" -> 0.5, "1408Mi" -> bytes, "2" -> 2)."""
    t = str(text).strip()
    for suffix in sorted(_QUANTITY_SUFFIX, key=len, reverse=True):
        if t.endswith(suffix):
            return float(t[: -len(suffix)]) * _QUANTITY_SUFFIX[suffix]
    return float(t)


# Object-count quota keys of the kinds a cluster creates (the short names and `count/<resource>[.<group>]`).
_COUNTED: dict[str, tuple[str, ...]] = {
    "ConfigMap": ("configmaps", "count/configmaps"),
    "Service": ("services", "count/services"),
    "Secret": ("secrets", "count/secrets"),
    "ServiceAccount": ("count/serviceaccounts",),
    "Deployment": ("count/deployments.apps",),
    "StatefulSet": ("count/statefulsets.apps",),
}


def quota_need(objs: list[Obj]) -> dict[str, float]:
    """What the objects in `objs` ask a ResourceQuota for, all replicas together: pods, requests and limits of
    cpu and memory (a pod counts its containers' sum, or its largest init container when that is more), the
    volume claims of StatefulSets (count and storage, also per storage class) and the number of objects."""
    total: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        total[key] = total.get(key, 0.0) + value

    for o in objs:
        for key in _COUNTED.get(o["kind"], ()):
            add(key, 1.0)
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        replicas = int(o["spec"].get("replicas", 1))
        for claim in o["spec"].get("volumeClaimTemplates") or []:
            storage = quantity((((claim.get("spec") or {}).get("resources") or {}).get("requests") or {})
                               .get("storage", 0))
            keys = [("persistentvolumeclaims", 1.0), ("count/persistentvolumeclaims", 1.0),
                    ("requests.storage", storage)]
            if sc := (claim.get("spec") or {}).get("storageClassName"):
                keys += [(f"{sc}.storageclass.storage.k8s.io/persistentvolumeclaims", 1.0),
                         (f"{sc}.storageclass.storage.k8s.io/requests.storage", storage)]
            for key, value in keys:
                add(key, value * replicas)
        spec = o["spec"]["template"]["spec"]
        pod: dict[str, float] = {"pods": 1.0}
        for kind in ("requests", "limits"):
            for res in ("cpu", "memory"):
                main = sum(quantity(((c.get("resources") or {}).get(kind) or {}).get(res, 0))
                           for c in spec.get("containers") or [])
                init = max((quantity(((c.get("resources") or {}).get(kind) or {}).get(res, 0))
                            for c in spec.get("initContainers") or []), default=0.0)
                pod[f"{kind}.{res}"] = max(main, init)
        pod["cpu"], pod["memory"] = pod["requests.cpu"], pod["requests.memory"]  # the quota's short names
        pod["count/pods"] = 1.0
        for k, v in pod.items():
            add(k, v * replicas)
    return total


def quota_shortfall(quotas: list[Obj], need: dict[str, float]) -> str | None:
    """Why `need` does not fit beside what the namespace's quotas count as used, or None when it fits."""
    short = []
    for q in quotas:
        status = q.get("status") or {}
        hard = status.get("hard") or (q.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for key, limit in sorted(hard.items()):
            if key in need and quantity(used.get(key, 0)) + need[key] > quantity(limit) + 1e-9:
                short.append(f"ResourceQuota {q['metadata']['name']}: {key} used {used.get(key, 0)} of {limit}, "
                             f"a second cluster needs {_fmt(key, need[key])} more")
    return "; ".join(short) or None


def _fmt(key: str, value: float) -> str:
    if "memory" in key or "storage" in key:
        return f"{value / 2**30:.0f}Gi" if value >= 2**30 and value % 2**30 == 0 else f"{value / 2**20:.0f}Mi"
    return f"{value:g}"

