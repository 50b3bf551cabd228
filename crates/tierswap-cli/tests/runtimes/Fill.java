// Fills MIB MiB of byte arrays (1 MiB each) with bytes that depend on their place, then
// reads every byte back twice; "churn SECONDS" keeps allocating short-lived arrays over a
// live set of MIB MiB for that long, checking each before it dies and the live set at the
// end; "spawn N" starts `sh -c 'echo spawned K'` N times with ProcessBuilder (the JDK's
// launcher: posix_spawn of jspawnhelper, which dups its pipes onto fds 0-3) and checks
// each one's output and exit status. Prints "jvm ok ..." when every byte was right, then
// "vmhwm_kib N" (the process's peak resident memory). Exit 1 on a wrong byte or a failed
// process.
public class Fill {
    static byte want(int i, int j) {
        int x = i * 0x9E3779B1 + j * 0x85EBCA77;
        return (byte) (x ^ (x >>> 15));
    }

    static byte[] make(int i) {
        byte[] b = new byte[1 << 20];
        for (int j = 0; j < b.length; j++) b[j] = want(i, j);
        return b;
    }

    static long wrong(byte[] b, int i) {
        long bad = 0;
        for (int j = 0; j < b.length; j++) if (b[j] != want(i, j)) bad++;
        return bad;
    }

    static long vmhwmKib() throws Exception {
        for (String l : java.nio.file.Files.readAllLines(java.nio.file.Path.of("/proc/self/status")))
            if (l.startsWith("VmHWM:")) return Long.parseLong(l.replaceAll("[^0-9]", ""));
        return -1;
    }

    public static void main(String[] args) throws Exception {
        int mib = Integer.parseInt(args[0]);
        byte[][] live = new byte[mib][];
        for (int i = 0; i < mib; i++) live[i] = make(i);
        long bad = 0;
        long churned = 0;
        if (args.length > 2 && args[1].equals("churn")) {
            long end = System.nanoTime() + Long.parseLong(args[2]) * 1_000_000_000L;
            java.util.Random r = new java.util.Random(7);
            while (System.nanoTime() < end) {
                // Short-lived objects: a batch of small arrays checked and dropped.
                for (int k = 0; k < 64; k++) {
                    int i = mib + r.nextInt(1 << 20);
                    byte[] s = new byte[16 << 10];
                    for (int j = 0; j < s.length; j++) s[j] = want(i, j);
                    for (int j = 0; j < s.length; j++) if (s[j] != want(i, j)) bad++;
                    churned++;
                }
                // And a live array replaced now and then.
                int v = r.nextInt(mib);
                bad += wrong(live[v], v);
                live[v] = make(v);
            }
        }
        long spawned = 0;
        if (args.length > 2 && args[1].equals("spawn")) {
            for (int k = 0; k < Integer.parseInt(args[2]); k++) {
                Process p = new ProcessBuilder("sh", "-c", "echo spawned " + k).start();
                String out = new String(p.getInputStream().readAllBytes()).trim();
                if (p.waitFor() != 0 || !out.equals("spawned " + k)) {
                    System.err.println("MISMATCH jvm: process " + k + " said '" + out + "'");
                    System.exit(1);
                }
                spawned++;
            }
        }
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < mib; i++) bad += wrong(live[i], i);
        if (bad != 0) {
            System.err.println("MISMATCH jvm: " + bad + " bytes wrong");
            System.exit(1);
        }
        System.out.println("jvm ok " + mib + " MiB, " + churned + " short-lived arrays, " + spawned + " processes");
        System.out.println("vmhwm_kib " + vmhwmKib());
    }
}
