// A Java client of hqueue, built by the test suite from thrift/hqueue.thrift
// with Apache Thrift's compiler (Debian's thrift-compiler) and libthrift-java.
// Usage: java HQueueJavaClient PORT QUEUE
// Prints one line per check; exits non-zero on the first failure.

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.transport.layered.TFramedTransport;
import org.apache.thrift.transport.TSocket;
import org.apache.thrift.transport.TTransport;
import org.hqueue.thrift.HQueueService;
import org.hqueue.thrift.TMessage;
import org.hqueue.thrift.TMessageID;
import org.hqueue.thrift.TMessageScan;
import org.hqueue.thrift.TQueueNotFound;

public class HQueueJavaClient {
    static ByteBuffer bytes(String s) {
        return ByteBuffer.wrap(s.getBytes(StandardCharsets.UTF_8));
    }

    static String text(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        String queue = args[1];
        TTransport transport = new TFramedTransport(new TSocket("127.0.0.1", port));
        transport.open();
        HQueueService.Client client = new HQueueService.Client(new TBinaryProtocol(transport));

        TMessage one = new TMessage();
        one.setTopic(bytes("java"));
        one.setValue(bytes("hello from java"));
        TMessageID id = client.putMessageWithPid(queue, (short) 1, one);
        System.out.println("put " + id.getTimestamp() + ":" + id.getSequenceID());

        List<TMessage> batch = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            TMessage m = new TMessage();
            m.setTopic(bytes("java"));
            m.setValue(bytes("batch " + i));
            batch.add(m);
        }
        List<TMessageID> ids = client.putMessagesWithPid(queue, (short) 1, batch);
        System.out.println("putMessages " + ids.size());

        TMessageScan scan = new TMessageScan();
        List<ByteBuffer> topics = new ArrayList<>();
        topics.add(bytes("java"));
        scan.setTopics(topics);
        int scanner = client.messageScannerOpen(queue, (short) 1, scan);
        List<TMessage> got = client.messageScannerGetList(scanner, 100);
        client.messageScannerClose(scanner);
        for (TMessage m : got) {
            System.out.println("scan " + m.getPartitionID() + " " + m.getId().getTimestamp() + ":"
                    + m.getId().getSequenceID() + " " + text(m.getTopic()) + " " + text(m.getValue()));
        }
        System.out.println("locations " + client.getQueueLocations(queue).size());

        try {
            client.putMessage("no_such_queue", one);
            System.out.println("FAIL: no exception");
            System.exit(1);
        } catch (TQueueNotFound e) {
            System.out.println("typed TQueueNotFound " + e.getQueue());
        }
        transport.close();
    }
}
