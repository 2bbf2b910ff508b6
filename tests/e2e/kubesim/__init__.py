"""kubesim: a small simulated Kubernetes cluster for the operator's tests.

No kube-apiserver or kubelet can run on the build machines, so this package
plays them, built on kmock (the emulator from kopf's author):

* `apiserver.ApiServer`: kmock plus the API-server behaviour the operator
  depends on and kmock hides: resourceVersion/generation, status and scale
  subresources, label selectors, server-side apply with field ownership,
  no-op writes that change nothing, delete preconditions, injected failures;
* `chunking.ChunkingProxy`: answers like a real API server does for bodies
  over ~2 KiB, chunked and without Content-Length;
* `deployments`, `replicasets`: the Deployment controller (its decisions in
  `rollout`) and the ReplicaSet controller; `controllers`: the EndpointSlice
  controller and the garbage collector; `graceful`: how a pod's DELETE marks it
  for its kubelet to stop;
* `kubelet.Kubelet`: runs each pod's real container command as a process on
  its own loopback address (127.x.y.z), probes it, restarts and kills it;
* `proxy.ServiceProxy`: kube-proxy, a TCP proxy per Service;
* `hub.Hub`: a stand-in for the Hugging Face Hub's download API (HF_ENDPOINT),
  for the pods' `pagoda download` init containers;
* `faults.MetricsNetwork`: how the operator reads pods' /metrics, with a
  pod's metrics made unreachable on demand (the pod itself serves on);
* `cluster.Cluster`: all of the above as one object with a test-friendly API;
* `operator.OperatorThread`: the Pagoda operator, run against any of them.

Test code only: never shipped, never imported by the operator.
"""
