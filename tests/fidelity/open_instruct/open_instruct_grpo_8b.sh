# open_instruct_grpo_8b: allenai/open-instruct docs/tulu3.md @c8b66a0e34efa3a891d4773bcfa40250498f3373, "(NEW)
# Llama-3.1-Tulu-3.1-8B Reproduction": the doc's command with its loop values (learning_rate 5e-7, beta 0.01, nspp 16,
# m half-m, kl_estimator kl3) and its single-node diff (local_rollout_batch_size 8, so local_mini_batch_size
# 8 x 16 / 2 = 64; --actor_num_gpus_per_node 6, --vllm_tensor_parallel_size 2, --deepspeed_stage 3) substituted;
# mason's launcher and the names of the run left out. tests/fidelity/open_instruct_rl.py parses its flags with the
# script's own parser.
python open_instruct/grpo_vllm_thread_ray_gtrl.py \
    --beta 0.01 \
    --local_mini_batch_size 64 \
    --number_samples_per_prompt 16 \
    --local_rollout_batch_size 8 \
    --kl_estimator kl3 \
    --learning_rate 5e-7 \
    --dataset_mixer_list allenai/RLVR-GSM-MATH-IF-Mixed-Constraints 1.0 \
    --dataset_mixer_list_splits train \
    --dataset_mixer_eval_list allenai/RLVR-GSM-MATH-IF-Mixed-Constraints 16 \
    --dataset_mixer_eval_list_splits train \
    --max_token_length 2048 \
    --max_prompt_token_length 2048 \
    --response_length 2048 \
    --model_name_or_path allenai/Llama-3.1-Tulu-3-8B-DPO \
    --non_stop_penalty \
    --stop_token eos \
    --temperature 1.0 \
    --ground_truths_key ground_truth \
    --chat_template_name tulu \
    --sft_messages_key messages \
    --total_episodes 10000000 \
    --penalty_reward_value 0.0 \
    --deepspeed_stage 3 \
    --per_device_train_batch_size 2 \
    --local_rollout_forward_batch_size 2 \
    --actor_num_gpus_per_node 6 \
    --num_epochs 1 \
    --vllm_tensor_parallel_size 2 \
    --lr_scheduler_type constant \
    --apply_verifiable_reward true \
    --seed 1 \
    --num_evals 30 \
    --save_freq 40 \
    --reward_model_multiplier 0.0 \
    --no_try_launch_beaker_eval_jobs \
    --try_launch_beaker_eval_jobs_on_weka \
    --gradient_checkpointing \
    --with_tracking
