"""A scripted KV connector inside vLLM.

``ScriptedConnector`` is a real ``KVConnectorBase_V1`` subclass that vLLM's
``KVConnectorFactory`` loads by name from ``KVTransferConfig.kv_connector_module_path``,
as it loads any out-of-tree connector.  Its scheduler side answers from the
stream's script (:class:`harness.formats.steps.ConnectorScript`, found through
``kv_connector_extra_config["script"]``), the same script the reference's
connector asks, and logs every call.  Its worker side is never built: the
harness runs no model, and the worker's report (loads and sends done) is
passed to ``update_from_output`` by the step loop.
"""

from __future__ import annotations

from harness.engines import vllm_env  # noqa: F401  (before vLLM is imported)

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata)

from harness.formats.steps import ConnectorScript  # noqa: E402

#: The class name and module vLLM's factory loads.
CONNECTOR = "ScriptedConnector"
MODULE = __name__

#: The scripts of the engines in this process, by the key in kv_connector_extra_config.
SCRIPTS: dict[str, ConnectorScript] = {}


class ScriptedConnector(KVConnectorBase_V1):

    def __init__(self, vllm_config, role, *args, **kwargs):
        super().__init__(vllm_config, role, *args, **kwargs)
        key = vllm_config.kv_transfer_config.kv_connector_extra_config["script"]
        self.script = SCRIPTS[key]

    # -- the scheduler side ------------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.script.matched_tokens(request.request_id, request.num_tokens,
                                          num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.script.allocated(request.request_id, blocks.get_block_ids()[0],
                              num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        return self.script.finished(request.request_id, list(block_ids)), None

    # -- the worker side: never built ----------------------------------------------------

    def start_load_kv(self, forward_context, **kwargs):
        raise NotImplementedError("the harness runs no worker")

    def wait_for_layer_load(self, layer_name):
        raise NotImplementedError("the harness runs no worker")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        raise NotImplementedError("the harness runs no worker")

    def wait_for_save(self):
        raise NotImplementedError("the harness runs no worker")
