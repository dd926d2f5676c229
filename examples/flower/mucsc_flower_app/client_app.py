"""ClientApp: ordinary Flower training code; ``mucsc_mod`` turns its reply into a mucsc message."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from mucsc.flower import mucsc_mod
from mucsc_flower_app import task

app = ClientApp(mods=[mucsc_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    net = task.model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y, _, _ = task.data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    loss = task.train(net, x, y, epochs=1, lr=float(msg.content["config"]["lr"]))
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                          "metrics": MetricRecord({"train_loss": loss, "num-examples": len(y)})})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    net = task.model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, _, x, y = task.data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    loss, acc = task.evaluate(net, x, y)
    return Message(RecordDict({"metrics": MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y)})}),
                   reply_to=msg)
