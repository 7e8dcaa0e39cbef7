package rocketraft.reference;

import com.google.gson.Gson;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.rocketmq.tools.command.MQAdminStartup;

// RocketMQ's own mqadmin (MQAdminStartup), many commands in one JVM: a JVM per command costs seconds on a busy machine,
// and a reference cluster's tests create many topics and groups (devkit/reference.py runs this).
// stdin: one JSON array of mqadmin arguments per line. stdout: one JSON object per command, {"output": "..."}, with
// everything the command printed (mqadmin reports a failure by printing its exception, not by an exit code).
public final class AdminBatch {
    private AdminBatch() {
    }

    public static void main(String[] args) throws Exception {
        Gson gson = new Gson();
        PrintStream answers = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        BufferedReader commands = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = commands.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            String[] command = gson.fromJson(line, String[].class);
            ByteArrayOutputStream printed = new ByteArrayOutputStream();
            PrintStream capture = new PrintStream(printed, true, StandardCharsets.UTF_8);
            PrintStream out = System.out;
            PrintStream err = System.err;
            System.setOut(capture);
            System.setErr(capture);
            try {
                MQAdminStartup.main0(command, null);
            } catch (Throwable t) {
                t.printStackTrace(capture);
            } finally {
                System.setOut(out);
                System.setErr(err);
            }
            answers.println(gson.toJson(Map.of("output", printed.toString(StandardCharsets.UTF_8))));
        }
    }
}
